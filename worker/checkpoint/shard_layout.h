#pragma once

#include <cstdint>
#include <vector>

#include "planner/plan.h"

namespace loom::checkpoint {

// Where one tensor-parallel rank's piece of a parameter lies in the whole HF tensor, as the
// Plan's layout says: along `dim`, each of the packed sub-parameters (one unless the layer spec
// packs several, as a fused q|k|v) is cut into `parts` equal pieces and this rank takes piece
// `index` of each. Under GQA with more ranks than KV heads, the KV projections are cut into one
// piece per KV head and `replicas` consecutive ranks share each (index = tp rank / replicas).
struct ShardLayout {
  std::vector<int64_t> whole, local;
  int dim = -1;                       // -1: whole on every rank
  int parts = 1;
  int index = 0;
  int replicas = 1;
  std::vector<int64_t> subParams;     // per-piece sizes of the packed sub-parameters; empty: one
  bool sharded() const { return dim >= 0; }
  // The sizes, along `dim`, of the packed sub-parameters in one piece.
  std::vector<int64_t> pieceSizes() const;
};

ShardLayout shardLayout(const planner::ParameterSpec& spec, int tpRank, int tpSize);

// Elements of a piece that lie end to end in the whole parameter too, both flattened.
struct ElementRun {
  int64_t piece = 0;   // first element in the piece
  int64_t whole = 0;   // the same element in the whole parameter
  int64_t length = 0;
};

// Where the piece's elements [offset, offset + length) lie in the whole parameter: one run for a
// parameter split along its first dimension (or whole), one per row and packed sub-parameter for
// one split along another.
std::vector<ElementRun> wholeRuns(const ShardLayout& layout, int64_t offset, int64_t length);

}  // namespace loom::checkpoint
