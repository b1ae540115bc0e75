#pragma once

#include <optional>
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

// What a parameter is in its layer, from its HF name: what AutoTP's default rule and the plan's
// summary go by. Expert and shared-expert MLPs have the roles of a dense MLP's (gate, up, down);
// ParameterInfo::expert tells an expert's apart.
enum class LayerRole {
  kEmbedding,        // model.embed_tokens
  kHead,             // lm_head
  kNorm,             // every RMSNorm (layer norms, q/k norms, latent norms, the final norm)
  kQuery,            // q_proj, or q_b_proj under latent attention
  kKey,              // k_proj
  kValue,            // v_proj
  kKeyValue,         // kv_b_proj: keys and values up from the latent, by head
  kLatent,           // q_a_proj, kv_a_proj_with_mqa: down to the latents (latent attention)
  kAttentionOutput,  // o_proj
  kGate,             // gate_proj, Mixtral's w1
  kUp,               // up_proj, Mixtral's w3
  kDown,             // down_proj, Mixtral's w2
  kRouter,           // mlp.gate / block_sparse_moe.gate and deepseek_v3's correction bias
  kSharedExpertGate, // qwen2_moe's shared_expert_gate
  kOther,
};
const char* layerRoleName(LayerRole role);
LayerRole layerRole(const ParameterInfo& parameter);

// DeepSpeed's `shape` of a layer spec, one entry per dimension of the parameter: the size (or -1,
// any), except at the partition dimension, where `subParams` lists the sizes of unequal
// sub-parameters packed along it ([q, k, v]), or `count` > 1 says it packs that many equal ones
// ([gate, up]). Each sub-parameter is split on its own.
struct TpShapeDim {
  int64_t size = -1;
  int64_t count = 0;              // at the partition dimension: equal sub-parameters; 0: not given
  std::vector<int64_t> subParams;  // at the partition dimension: unequal sub-parameter sizes
};

// DeepSpeed's partition_config.layer_specs entry: parameters whose name matches one of `patterns`
// (regexes matched from the start of the name, as Python's re.match) take `split` instead of the
// default rule. DeepSpeed's partition_type "skip" is kReplicated.
struct TpLayerSpec {
  std::vector<std::string> patterns;
  TpSplit split = TpSplit::kColumn;
  std::vector<TpShapeDim> shape;       // empty: not given
  std::optional<int> partitionDim;     // default: 0 for column, 1 for row
  bool gatherOutput = false;           // column: all-gather the output so every rank has all of it
  bool gradAllreduce = false;          // skip: whole, but its gradient summed over the TP group
};

// DeepSpeed's tensor_parallel section.
struct TensorParallelConfig {
  int size = 0;                   // autotp_size; 0 (and 1): off
  bool useDefaultSpecs = true;    // the default rule applies where no layer spec matches
  bool strictMode = false;        // a matrix no layer spec (nor, if used, the default rule) covers is an error
  std::vector<TpLayerSpec> layerSpecs;
  int ranks() const { return size > 1 ? size : 1; }
};

struct TpLayout {
  TpSplit split = TpSplit::kReplicated;
  int splitDim = -1;                // the dimension split, -1 when whole
  std::vector<int64_t> localShape;  // on each rank of the group
  // Under GQA with more ranks than KV heads, each KV head is copied to this many ranks.
  int kvReplication = 1;
  std::vector<int64_t> subParams;   // sizes of the sub-parameters packed along splitDim, each split; empty: one
  bool gatherOutput = false;
  bool gradAllreduce = false;
};

// AutoTP's layout of every parameter over `tp` ranks: row-parallel for o_proj and down_proj,
// column-parallel for the other projections, vocabulary-parallel embedding and head, the rest
// replicated. Latent attention follows DeepSpeed's deepseek_v2 preset: q_a_proj and
// kv_a_proj_with_mqa whole, q_b_proj and kv_b_proj column-parallel by heads. Layer specs override
// by pattern, first match wins; without useDefaultSpecs a parameter no spec matches stays whole.
// Heads stay whole: InvalidArgument names what does not divide (heads % tp, the KV heads against
// tp, vocab % tp, ...).
StatusOr<std::vector<TpLayout>> layoutTensorParallel(const ModelConfig& config,
                                                     const std::vector<ParameterInfo>& parameters,
                                                     const TensorParallelConfig& tp);
StatusOr<std::vector<TpLayout>> layoutTensorParallel(const ModelConfig& config,
                                                     const std::vector<ParameterInfo>& parameters, int tp,
                                                     const std::vector<TpLayerSpec>& specs = {});

}  // namespace loom::planner
