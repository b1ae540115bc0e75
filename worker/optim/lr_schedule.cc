#include "worker/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace loom::train {
namespace {

// Warmup progress in [0, 1): log(step + 1) / log(warmup) by default, step / warmup when linear.
// DeepSpeed raises the warmup to at least 2 steps so that the log is defined.
double warmupFraction(const planner::SchedulerConfig& s, int64_t step) {
  const double warmup = static_cast<double>(std::max<int64_t>(2, s.warmupNumSteps));
  if (s.warmupLinear) return static_cast<double>(step) / warmup;
  return std::log(static_cast<double>(step + 1)) / std::log(warmup);
}

bool inWarmup(const planner::SchedulerConfig& s, int64_t step) {
  return step < std::max<int64_t>(2, s.warmupNumSteps) && s.warmupNumSteps > 0;
}

// DeepSpeed's get_lr() at scheduler iteration `step`.
double scheduleValue(const planner::SchedulerConfig& s, double optimizerLr, int64_t step) {
  using planner::SchedulerType;
  switch (s.type) {
    case SchedulerType::kConstant:
      return optimizerLr;
    case SchedulerType::kWarmupLR:
    case SchedulerType::kWarmupDecayLR: {
      double gamma;
      if (inWarmup(s, step)) {
        gamma = warmupFraction(s, step);
      } else if (s.type == SchedulerType::kWarmupLR) {
        gamma = 1.0;
      } else {
        const double left = static_cast<double>(s.totalNumSteps - step);
        gamma = std::max(0.0, left / std::max(1.0, static_cast<double>(s.totalNumSteps - s.warmupNumSteps)));
      }
      return s.warmupMinLr + (s.warmupMaxLr.value_or(optimizerLr) - s.warmupMinLr) * gamma;
    }
    case SchedulerType::kWarmupCosineLR: {
      double ratio;
      if (inWarmup(s, step)) {
        ratio = s.warmupMinRatio + warmupFraction(s, step) * (1.0 - s.warmupMinRatio);
      } else if (step >= s.totalNumSteps) {
        ratio = s.cosMinRatio;  // past the end it stays at the floor
      } else {
        const double done = static_cast<double>(step - s.warmupNumSteps + 1);
        const double total = static_cast<double>(s.totalNumSteps - s.warmupNumSteps);
        const double cosine = (1.0 + std::cos(M_PI * done / total)) / 2.0;
        ratio = std::max(0.0, s.cosMinRatio + (1.0 - s.cosMinRatio) * cosine);
      }
      return optimizerLr * ratio;
    }
  }
  return optimizerLr;
}

}  // namespace

double learningRate(const planner::SchedulerConfig& s, double optimizerLr, int64_t step) {
  using planner::SchedulerType;
  if (s.type == SchedulerType::kConstant) return optimizerLr;
  if (step == 0) return s.type == SchedulerType::kWarmupCosineLR ? 0.0 : s.warmupMinLr;
  return scheduleValue(s, optimizerLr, step - 1);
}

LearningRates learningRates(const planner::SchedulerConfig& schedule, const planner::OptimizerConfig& optimizer,
                            int64_t step) {
  LearningRates out{.lr = learningRate(schedule, optimizer.lr, step)};
  if (optimizer.type == planner::OptimizerType::kMuon) out.muonLr = learningRate(schedule, optimizer.muon.lr, step);
  return out;
}

}  // namespace loom::train
