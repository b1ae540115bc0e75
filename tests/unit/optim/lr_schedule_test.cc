#include "worker/optim/lr_schedule.h"

#include <cmath>

#include "tests/catch.h"

using loom::planner::SchedulerConfig;
using loom::planner::SchedulerType;
using loom::train::learningRate;
using loom::train::learningRates;

// Expected values are DeepSpeed's formulas (runtime/lr_schedules.py) evaluated by hand.
// Expected values: DeepSpeed's formulas, one iteration behind the optimizer step (the scheduler
// is stepped after each optimizer step, starting from its initial value).
TEST_CASE("WarmupLR: the sequence DeepSpeed 0.19.8 produced", "[train]") {
  SchedulerConfig s{.type = SchedulerType::kWarmupLR, .warmupMinLr = 0.0, .warmupMaxLr = 1e-3, .warmupNumSteps = 4,
                    .warmupLinear = true};
  const double observed[] = {0, 0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3};
  for (int step = 0; step < 7; ++step) CHECK(learningRate(s, 5.0, step) == Approx(observed[step]).margin(1e-12));
}

TEST_CASE("WarmupLR: log warmup from warmup_min_lr, then the max", "[train]") {
  SchedulerConfig s{.type = SchedulerType::kWarmupLR, .warmupMinLr = 1e-5, .warmupMaxLr = 1e-3, .warmupNumSteps = 10};
  CHECK(learningRate(s, 5.0, 0) == 1e-5);  // the first two steps run at warmup_min_lr
  CHECK(learningRate(s, 5.0, 1) == 1e-5);
  CHECK(learningRate(s, 5.0, 2) == Approx(1e-5 + (1e-3 - 1e-5) * std::log(2.0) / std::log(10.0)));
  CHECK(learningRate(s, 5.0, 10) == Approx(1e-3));
  CHECK(learningRate(s, 5.0, 11) == 1e-3);
  CHECK(learningRate(s, 5.0, 1000) == 1e-3);
}

TEST_CASE("WarmupDecayLR: warmup then linear decay to warmup_min_lr at total_num_steps", "[train]") {
  SchedulerConfig s{.type = SchedulerType::kWarmupDecayLR, .warmupMinLr = 0.0, .warmupMaxLr = 1e-3,
                    .warmupNumSteps = 10, .warmupLinear = true, .totalNumSteps = 110};
  CHECK(learningRate(s, 1.0, 6) == Approx(5e-4));
  CHECK(learningRate(s, 1.0, 11) == Approx(1e-3));
  CHECK(learningRate(s, 1.0, 61) == Approx(5e-4));
  CHECK(learningRate(s, 1.0, 111) == 0.0);
  CHECK(learningRate(s, 1.0, 200) == 0.0);
}

TEST_CASE("WarmupCosineLR: ratio warmup, cosine to cos_min_ratio, then held", "[train]") {
  SchedulerConfig s{.type = SchedulerType::kWarmupCosineLR, .warmupNumSteps = 10, .warmupLinear = true,
                    .totalNumSteps = 110, .warmupMinRatio = 0.2, .cosMinRatio = 0.1};
  const double lr = 2e-3;
  CHECK(learningRate(s, lr, 0) == 0.0);  // not warmup_min_ratio: DeepSpeed starts the optimizer at 0
  CHECK(learningRate(s, lr, 1) == Approx(lr * 0.2));
  CHECK(learningRate(s, lr, 6) == Approx(lr * (0.2 + 0.8 * 0.5)));
  // iteration 59: (59 - 10 + 1) / 100 of the way, cosine factor (1 + cos(pi/2)) / 2 = 0.5
  CHECK(learningRate(s, lr, 60) == Approx(lr * (0.1 + 0.9 * 0.5)));
  CHECK(learningRate(s, lr, 110) == Approx(lr * 0.1));
  CHECK(learningRate(s, lr, 500) == Approx(lr * 0.1));
}

TEST_CASE("no scheduler: the optimizer's lr", "[train]") {
  CHECK(learningRate(SchedulerConfig{}, 3e-4, 0) == 3e-4);
  CHECK(learningRate(SchedulerConfig{}, 3e-4, 99) == 3e-4);
}

TEST_CASE("warmup_max_lr unset: each optimizer half rises to its own lr, as DeepSpeed's param groups do",
          "[optim][lr][muon]") {
  SchedulerConfig s{.type = SchedulerType::kWarmupLR, .warmupMinLr = 0.0, .warmupNumSteps = 4, .warmupLinear = true};
  loom::planner::OptimizerConfig muon{.type = loom::planner::OptimizerType::kMuon, .lr = 3e-3};
  muon.muon.lr = 0.02;
  const auto start = learningRates(s, muon, 1), warm = learningRates(s, muon, 10);
  CHECK((start.lr == 0 && start.muonLr == 0));
  CHECK((warm.lr == Approx(3e-3) && warm.muonLr == Approx(0.02)));
  s.warmupMaxLr = 1e-3;  // given: every half rises to it (DeepSpeed formats one value for all groups)
  CHECK((learningRates(s, muon, 10).lr == Approx(1e-3) && learningRates(s, muon, 10).muonLr == Approx(1e-3)));
}
