#include "worker/train/lr_schedule.h"

#include <cmath>

#include "tests/catch.h"

using loom::planner::SchedulerConfig;
using loom::planner::SchedulerType;
using loom::train::learningRate;

// Expected values are DeepSpeed's formulas (runtime/lr_schedules.py) evaluated by hand.
TEST_CASE("WarmupLR: log warmup from warmup_min_lr, then the max", "[train]") {
  SchedulerConfig s{.type = SchedulerType::kWarmupLR, .warmupMinLr = 0.0, .warmupMaxLr = 1e-3, .warmupNumSteps = 10};
  CHECK(learningRate(s, 5.0, 0) == 0.0);  // DeepSpeed's first step runs at warmup_min_lr
  CHECK(learningRate(s, 5.0, 1) == Approx(1e-3 * std::log(2.0) / std::log(10.0)));
  CHECK(learningRate(s, 5.0, 9) == Approx(1e-3 * std::log(10.0) / std::log(10.0)));
  CHECK(learningRate(s, 5.0, 10) == 1e-3);
  CHECK(learningRate(s, 5.0, 1000) == 1e-3);
  s.warmupLinear = true;
  CHECK(learningRate(s, 5.0, 3) == Approx(3e-4));
}

TEST_CASE("WarmupDecayLR: warmup then linear decay to zero at total_num_steps", "[train]") {
  SchedulerConfig s{.type = SchedulerType::kWarmupDecayLR, .warmupMinLr = 0.0, .warmupMaxLr = 1e-3,
                    .warmupNumSteps = 10, .warmupLinear = true, .totalNumSteps = 110};
  CHECK(learningRate(s, 1.0, 5) == Approx(5e-4));
  CHECK(learningRate(s, 1.0, 10) == Approx(1e-3));
  CHECK(learningRate(s, 1.0, 60) == Approx(5e-4));
  CHECK(learningRate(s, 1.0, 110) == 0.0);
  CHECK(learningRate(s, 1.0, 200) == 0.0);
}

TEST_CASE("WarmupCosineLR: ratio warmup, cosine to cos_min_ratio, then held", "[train]") {
  SchedulerConfig s{.type = SchedulerType::kWarmupCosineLR, .warmupNumSteps = 10, .warmupLinear = true,
                    .totalNumSteps = 110, .warmupMinRatio = 0.0, .cosMinRatio = 0.1};
  const double lr = 2e-3;
  CHECK(learningRate(s, lr, 0) == 0.0);
  CHECK(learningRate(s, lr, 5) == Approx(lr * 0.5));
  // step 59: (59 - 10 + 1) / 100 of the way: cosine factor (1 + cos(pi/2)) / 2 = 0.5
  CHECK(learningRate(s, lr, 59) == Approx(lr * (0.1 + 0.9 * 0.5)));
  CHECK(learningRate(s, lr, 109) == Approx(lr * 0.1));
  CHECK(learningRate(s, lr, 500) == Approx(lr * 0.1));
}

TEST_CASE("no scheduler: the optimizer's lr", "[train]") {
  CHECK(learningRate(SchedulerConfig{}, 3e-4, 0) == 3e-4);
  CHECK(learningRate(SchedulerConfig{}, 3e-4, 99) == 3e-4);
}
