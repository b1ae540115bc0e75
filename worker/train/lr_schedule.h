#pragma once

#include <cstdint>

#include "planner/deepspeed_config.h"

namespace loom::train {

// The learning rate of optimizer step `step` (0-based), as DeepSpeed's schedulers give it: they
// are built at iteration 0, so the first step already runs at the warmup's start (warmup_min_lr,
// which is 0 by default: DeepSpeed's first step does not move the weights).
double learningRate(const planner::SchedulerConfig& schedule, double optimizerLr, int64_t step);

}  // namespace loom::train
