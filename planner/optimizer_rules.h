#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/model_config.h"

namespace loom::planner {

struct ParameterInfo;
struct ParameterSpec;

// How an optimizer treats one parameter: the single table that the planner's memory estimate and
// the worker's optimizer both read.
struct OptimizerRule {
  const char* name;  // "AdamW", "Muon", ...
  // false: elementwise, so any piece of the parameter updates on its own (ZeRO partitions it
  // freely); true: the update needs the whole matrix's gradient (Muon's Newton-Schulz).
  bool perMatrix;
  // The fp32 tensors of the parameter's size it keeps, by the names checkpoints give them.
  std::vector<std::string> stateNames;
};

// The rule of a parameter under `optimizer`: Muon's for a Muon matrix (`muonMatrix`, from
// ParameterSpec::muon), else the optimizer's elementwise rule (under Muon, its auxiliary Adam's).
const OptimizerRule& optimizerRule(const OptimizerConfig& optimizer, bool muonMatrix);

// DeepSpeed's rule for which parameters Muon takes (deepspeed.set_optimizer_flags): matrices, by
// the layer's shape (never a ZeRO partition's), whose names contain neither "embed" nor
// "lm_head". The rest go to the auxiliary Adam.
bool isMuonMatrix(const std::string& name, const std::vector<int64_t>& shape);

// The fp32 optimizer-state tensors a trainable element carries on average, over `parameters`
// (those that train), for the memory estimate: AdamW 2, Lion 1, Muon 1 on its matrices and 2 on
// the rest.
double optimizerStatesPerElement(const OptimizerConfig& optimizer, const std::vector<ParameterInfo>& parameters);

// Per-head Muon: the width of the heads a projection's output dimension is blocked by, from the
// model's config (q: num_attention_heads x head_dim; k and v: their KV head count; latent
// attention's q_b_proj and kv_b_proj their per-head widths), confirmed by the shape (rows ==
// heads x width); 0 for anything else (the output projection's heads are on its input dimension).
// The width, not the count, survives a column-parallel split: a shard of r rows holds r / width
// whole heads.
int64_t attentionHeadWidth(const ModelConfig& model, const ParameterSpec& parameter);

// Marks the Plan's Muon matrices (ParameterSpec::muon) and, with per_head_muon, their head width on
// this rank's shard (ParameterSpec::muonHeadDim). As DeepSpeed, an opt-in that tags nothing is an
// error (naming deepspeed.optimizer.params.per_head_muon): no trainable attention projection, or
// every one cut across its heads by tensor parallelism.
Status tagMuonParameters(const OptimizerConfig& optimizer, const ModelConfig& model,
                         std::vector<ParameterSpec>& parameters);

}  // namespace loom::planner
