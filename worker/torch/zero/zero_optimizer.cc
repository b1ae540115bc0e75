#include "worker/torch/zero/zero_optimizer.h"

#include "worker/torch/model/decoder_model.h"
#include "worker/torch/zero/zero_stage0.h"
#include "worker/torch/zero/zero_stage12.h"
#include "worker/torch/zero/zero_stage3.h"

namespace loom::worker {

Status checkZeroPlan(const planner::DeepSpeedConfig& config, const planner::Plan& plan, const DecoderModel& model,
                     const backends::Communicator& dp) {
  const planner::ZeroPlan& zero = plan.zero;
  if (zero.denseGroupSize != dp.size() || zero.stage != config.zero.stage)
    return failedPrecondition("plan: ZeRO stage {} over {} ranks, but the job runs stage {} over a data-parallel group "
                              "of {}",
                              zero.stage, zero.denseGroupSize, config.zero.stage, dp.size());
  if (zero.stage != 1 && zero.stage != 2) return Status::ok();
  const auto& params = model.parameters();
  std::vector<int> seen(params.size(), 0);
  for (const auto& buffer : zero.buffers) {
    for (int i : buffer.members.empty() ? std::vector<int>{} : buffer.members[0]) {
      if (i < 0 || i >= static_cast<int>(params.size()))
        return failedPrecondition("plan: ZeRO buffer of block {} names parameter {}, the model has {}", buffer.block, i,
                                  params.size());
      ++seen[i];
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const bool trains = params[i].second.requires_grad();
    if (seen[i] != (trains ? 1 : 0))
      return failedPrecondition("plan: {} is in {} ZeRO flat buffers, but it {} (was the Plan compiled with another "
                                "train.frozen_parameters?)",
                                params[i].first, seen[i], trains ? "trains" : "is frozen");
  }
  return Status::ok();
}

std::unique_ptr<ZeroEngine> makeZeroEngine(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                           DecoderModel& model, const ZeroGroups& groups) {
  switch (config.zero.stage) {
    case 0: return makeZeroStage0(config, plan, model, groups);
    case 1:
    case 2: return makeZeroStage12(config, plan, model, groups);
    default: return makeZeroStage3(config, plan, model, groups);
  }
}

}  // namespace loom::worker
