#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/model_config.h"

namespace loom::planner {

// Ulysses sequence parallelism (DeepSpeed's sequence/layer.py): the all-to-all scatters heads and
// gathers the sequence, so the sequence must split into sp parts, the query heads into sp groups,
// and the KV heads either split too or be copied to every rank (sp a multiple of them). With
// tensor parallelism beside it, the heads are those of one tensor-parallel rank (heads / tp; a
// KV head copied over tp ranks counts once). InvalidArgument names the number that does not divide.
Status checkSequenceParallel(const ModelConfig& config, int sp, int64_t sequenceLength, int tp = 1);

// Expert parallelism: the experts split evenly over ep ranks.
Status checkExpertParallel(const ModelConfig& config, int ep);
// The expert-parallel rank that owns `expert`: consecutive experts share a rank, as DeepSpeed
// lays them out (rank r holds experts r*E/ep to (r+1)*E/ep - 1).
int expertOwner(int expert, int64_t numExperts, int ep);

// How AutoEP routes tokens: the expert_parallel settings, with what they leave "auto" taken from
// the model config.
struct ExpertRouting {
  std::string preset;                 // the AutoEP preset: mixtral, qwen3_moe, deepseek_v3
  RouterConfig::Scoring scoring = RouterConfig::Scoring::kSoftmax;
  int64_t topK = 1;
  bool normalizeTopK = false;         // route_norm
  double routeScale = 1.0;
  double routedScalingFactor = 1.0;
  int64_t groups = 1;                 // num_expert_groups
  int64_t groupsPerToken = 1;         // num_limited_groups
  bool sharedExperts = false;
  bool groupedMm = true;
  ExpertMlpConfig expertMlp;          // expert_activation, gate_up_impl
};
// InvalidArgument when a setting contradicts the model: a preset of another family, more experts
// per token than experts, groups that do not divide the experts, shared experts the model has not
// (or has and would lose).
StatusOr<ExpertRouting> resolveRouting(const ModelConfig& config, const ExpertParallelConfig& ep);

}  // namespace loom::planner
