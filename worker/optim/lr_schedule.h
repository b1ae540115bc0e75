#pragma once

#include <cstdint>

#include "planner/deepspeed_config.h"

namespace loom::train {

// The learning rate of optimizer step `step` (0-based, counting applied steps only), as a
// DeepSpeed run gets it. DeepSpeed builds the scheduler before the first step, at its initial
// value (warmup_min_lr; 0 for WarmupCosineLR), and steps it after each optimizer step starting
// from iteration 0: so steps 0 and 1 both run at the warmup's start, and step s > 0 runs at the
// schedule's value for iteration s - 1. (Measured against DeepSpeed 0.19.8, tests/oracles.)
double learningRate(const planner::SchedulerConfig& schedule, double optimizerLr, int64_t step);

}  // namespace loom::train
