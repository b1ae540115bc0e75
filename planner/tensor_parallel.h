#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/model_config.h"
#include "planner/model_parameters.h"

namespace loom::planner {

enum class TpSplit {
  kReplicated,  // whole on every rank of the tensor-parallel group (norms, row-parallel biases)
  kColumn,      // output features split (dim 0): q/k/v, gate/up; all-reduce in backward
  kRow,         // input features split (dim 1): o_proj, down_proj; all-reduce in forward
  kVocab,       // vocabulary split (dim 0): embedding and head
};
const char* tpSplitName(TpSplit split);

// DeepSpeed's partition_config.layer_specs entry: parameters whose name matches `pattern`
// (a regex, searched) take `split` instead of the default rule.
struct TpLayerSpec {
  std::string pattern;
  TpSplit split = TpSplit::kColumn;
};

struct TpLayout {
  TpSplit split = TpSplit::kReplicated;
  std::vector<int64_t> localShape;  // on each rank of the group
  // Under GQA with more ranks than KV heads, each KV head is copied to this many ranks.
  int kvReplication = 1;
};

// AutoTP's layout of every parameter over `tp` ranks: row-parallel for o_proj and down_proj,
// column-parallel for the other projections, vocabulary-parallel embedding and head, the rest
// replicated. Latent attention follows DeepSpeed's deepseek_v2 preset: q_a_proj and
// kv_a_proj_with_mqa whole, q_b_proj and kv_b_proj column-parallel by heads. `specs` override by
// pattern, first match wins. Heads stay whole: InvalidArgument names what does not divide
// (heads % tp, the KV heads against tp, vocab % tp, ...).
StatusOr<std::vector<TpLayout>> layoutTensorParallel(const ModelConfig& config,
                                                     const std::vector<ParameterInfo>& parameters, int tp,
                                                     const std::vector<TpLayerSpec>& specs = {});

}  // namespace loom::planner
