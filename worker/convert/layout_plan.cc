#include "worker/convert/layout_plan.h"

#include "planner/plan_compiler.h"

namespace loom::convert {

StatusOr<LayoutPlan> compileLayout(const planner::ModelConfig& model, const nlohmann::json& deepspeed, int ranks,
                                   const std::vector<std::string>& frozen, const std::string& where) {
  LayoutPlan out{.ranks = ranks};
  auto config = planner::parseDeepSpeedConfig(deepspeed, ranks, /*training=*/true);
  if (!config.isOk()) return config.status().withContext(where);
  out.deepspeed = *config;
  planner::JobSpec spec;
  spec.name = "convert";
  spec.kind = planner::JobKind::kTrain;
  spec.ranks = ranks;
  spec.deepspeed = out.deepspeed;
  spec.train.frozenParameters = frozen;
  // The layout of the state does not depend on the sequence, nor is memory checked: the job that
  // resumes checks its own.
  auto plan = planner::compilePlan(model, spec);
  if (!plan.isOk()) return plan.status().withContext(where);
  out.plan = std::move(*plan);
  return out;
}

nlohmann::json deepspeedForLayout(const nlohmann::json& source, const planner::ConvertLayout& layout) {
  nlohmann::json out = source;
  if (layout.zeroStage >= 0) out["zero_optimization"]["stage"] = layout.zeroStage;
  if (layout.tensorParallel) out["tensor_parallel"]["autotp_size"] = layout.tensorParallel;
  if (layout.sequenceParallel) out["sequence_parallel_size"] = layout.sequenceParallel;
  if (layout.expertParallel) {
    out["expert_parallel"]["autoep_size"] = layout.expertParallel;
    if (layout.expertParallel > 1) out["expert_parallel"]["enabled"] = true;
  }
  if (layout.paramPersistenceThreshold >= 0)
    out["zero_optimization"]["stage3_param_persistence_threshold"] = layout.paramPersistenceThreshold;
  if (layout.modelPersistenceThreshold >= 0)
    out["zero_optimization"]["stage3_model_persistence_threshold"] = layout.modelPersistenceThreshold;
  out.erase("train_micro_batch_size_per_gpu");
  out.erase("gradient_accumulation_steps");
  return out;
}

}  // namespace loom::convert
