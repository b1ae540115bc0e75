#pragma once

#include <cstdint>

#include "planner/deepspeed_config.h"

namespace loom::train {

// The learning rate of optimizer step `step` (0-based, counting applied steps only), as a
// DeepSpeed run gets it. DeepSpeed builds the scheduler before the first step, at its initial
// value (warmup_min_lr; 0 for WarmupCosineLR), and steps it after each optimizer step starting
// from iteration 0: so steps 0 and 1 both run at the warmup's start, and step s > 0 runs at the
// schedule's value for iteration s - 1. (Measured against DeepSpeed 0.19.8, tests/oracles.)
// `optimizerLr` is the lr of the optimizer (or of its half): WarmupCosineLR scales it, and
// WarmupLR / WarmupDecayLR rise to it when warmup_max_lr is not given.
double learningRate(const planner::SchedulerConfig& schedule, double optimizerLr, int64_t step);

// A step's learning rates: the elementwise optimizer's (for Muon its auxiliary Adam's) and, under
// Muon, the matrices'. DeepSpeed's schedulers move every param group: each half from its own lr.
struct LearningRates {
  double lr = 0;
  double muonLr = 0;
};
LearningRates learningRates(const planner::SchedulerConfig& schedule, const planner::OptimizerConfig& optimizer,
                            int64_t step);

}  // namespace loom::train
