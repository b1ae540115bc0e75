#include "planner/parallel_checks.h"

#include <algorithm>

namespace loom::planner {

Status checkSequenceParallel(const ModelConfig& c, int sp, int64_t sequenceLength, int tp) {
  if (sp < 1) return invalidArgument("sequence_parallel_size: must be at least 1, got {}", sp);
  if (sp == 1) return Status::ok();
  if (sequenceLength % sp != 0)
    return invalidArgument("sequence_parallel_size {}: the sequence length {} is not a multiple of it", sp,
                           sequenceLength);
  if (tp > 1) {
    // The tensor-parallel checks (heads % tp) come first; here the heads of one rank.
    const int64_t heads = c.numHeads / tp, kvHeads = std::max<int64_t>(1, c.numKvHeads / tp);
    if (heads % sp != 0)
      return invalidArgument("sequence_parallel_size {}: the {} attention heads of a tensor-parallel rank "
                             "(num_attention_heads {} / tensor parallel {}) are not a multiple of it",
                             sp, heads, c.numHeads, tp);
    if (kvHeads % sp != 0 && sp % kvHeads != 0)
      return invalidArgument("sequence_parallel_size {}: the {} KV heads of a tensor-parallel rank neither split "
                             "into it nor divide it",
                             sp, kvHeads);
    return Status::ok();
  }
  if (c.numHeads % sp != 0)
    return invalidArgument("sequence_parallel_size {}: num_attention_heads {} is not a multiple of it", sp, c.numHeads);
  if (c.numKvHeads % sp != 0 && sp % c.numKvHeads != 0)
    return invalidArgument("sequence_parallel_size {}: num_key_value_heads {} neither splits into it nor divides it",
                           sp, c.numKvHeads);
  return Status::ok();
}

Status checkExpertParallel(const ModelConfig& c, int ep) {
  if (ep < 1) return invalidArgument("expert_parallel.autoep_size: must be at least 1, got {}", ep);
  if (ep == 1) return Status::ok();
  if (!c.isMoe()) return invalidArgument("expert_parallel.autoep_size {}: {} has no experts", ep, modelFamilyName(c.family));
  if (c.numExperts % ep != 0)
    return invalidArgument("expert_parallel.autoep_size {}: the {} experts do not split evenly over it", ep,
                           c.numExperts);
  return Status::ok();
}

int expertOwner(int expert, int64_t numExperts, int ep) {
  return static_cast<int>(expert / (numExperts / ep));
}

namespace {

// AutoEP's preset for a model family; empty when it has none.
std::string presetOf(ModelFamily family) {
  switch (family) {
    case ModelFamily::kMixtral: return "mixtral";
    case ModelFamily::kQwen2Moe:
    case ModelFamily::kQwen3Moe: return "qwen3_moe";  // DeepSpeed's qwen3_moe preset covers qwen2_moe
    case ModelFamily::kDeepseekV3: return "deepseek_v3";
    default: return "";
  }
}

}  // namespace

StatusOr<ExpertRouting> resolveRouting(const ModelConfig& c, const ExpertParallelConfig& ep) {
  constexpr const char* kWhere = "deepspeed.expert_parallel";
  if (!c.isMoe()) return invalidArgument("{}.enabled: {} has no experts", kWhere, modelFamilyName(c.family));
  ExpertRouting r;
  r.preset = presetOf(c.family);
  if (!ep.presetModel.empty() && ep.presetModel != r.preset)
    return invalidArgument("{}.preset_model: \"{}\" does not fit a {} model (its preset is {})", kWhere,
                           ep.presetModel, modelFamilyName(c.family), r.preset);
  r.scoring = ep.scoreFunc == "auto"      ? c.router.scoring
              : ep.scoreFunc == "sigmoid" ? RouterConfig::Scoring::kSigmoid
                                          : RouterConfig::Scoring::kSoftmax;
  r.topK = ep.topK ? ep.topK : c.expertsPerToken;
  if (r.topK > c.numExperts)
    return invalidArgument("{}.top_k: {} is above the model's {} experts", kWhere, r.topK, c.numExperts);
  r.normalizeTopK = ep.routeNorm.value_or(c.router.normalizeTopK);
  r.routeScale = ep.routeScale;
  r.routedScalingFactor = ep.routedScalingFactor.value_or(c.router.scalingFactor);
  r.groups = ep.numExpertGroups ? ep.numExpertGroups : c.router.groups;
  r.groupsPerToken = ep.numLimitedGroups ? ep.numLimitedGroups : std::min(c.router.groupsPerToken, r.groups);
  if (c.numExperts % r.groups != 0)
    return invalidArgument("{}.num_expert_groups: the {} experts do not form {} equal groups", kWhere, c.numExperts,
                           r.groups);
  if (r.groupsPerToken > r.groups)
    return invalidArgument("{}.num_limited_groups: {} is above the {} expert groups", kWhere, r.groupsPerToken,
                           r.groups);
  const bool modelShared = c.sharedExpertIntermediateSize > 0;
  r.sharedExperts = ep.hasSharedExperts.value_or(modelShared);
  if (r.sharedExperts != modelShared)
    return invalidArgument("{}.has_shared_experts: {}, but the {} model {}", kWhere, r.sharedExperts,
                           modelFamilyName(c.family),
                           modelShared ? "has them (their parameters are in its checkpoint)" : "has none");
  r.groupedMm = ep.useGroupedMm;
  if (!ep.expertActivation.empty()) parseExpertActivation(ep.expertActivation, &r.expertMlp.activation);
  r.expertMlp.fusedGateUp = ep.gateUpImpl == "fused";
  return r;
}

}  // namespace loom::planner
