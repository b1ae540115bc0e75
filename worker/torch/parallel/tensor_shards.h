#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "planner/plan.h"

namespace loom::worker {

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
};

ShardLayout shardLayout(const planner::ParameterSpec& spec, int tpRank, int tpSize);

// This rank's piece of `whole` (a copy, contiguous).
at::Tensor takeShard(const at::Tensor& whole, const ShardLayout& layout);
// The whole tensor from every tensor-parallel rank's piece, `pieces` [tp, local...] in rank
// order (ranks sharing a replicated KV head hold equal pieces: the first of each is taken).
at::Tensor assembleShards(const at::Tensor& pieces, const ShardLayout& layout, int tpSize);

}  // namespace loom::worker
