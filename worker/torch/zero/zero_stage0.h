#pragma once

#include <memory>

#include "worker/torch/zero/zero_optimizer.h"

namespace loom::worker {

// Stage 0, plain data parallelism: every rank keeps the whole gradient (one fp32 buffer,
// all-reduced and averaged once per step), the whole optimizer state and, under bf16 / fp16, the
// whole fp32 masters.
std::unique_ptr<ZeroEngine> makeZeroStage0(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                           DecoderModel& model, const ZeroGroups& groups);

}  // namespace loom::worker
