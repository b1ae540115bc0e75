#include "worker/torch/jobs/wall_clock.h"

#include <fmt/format.h>

#include "worker/torch/model/model_setup.h"

namespace loom::worker {

namespace {

// DeepSpeed's names (deepspeed/utils/timer.py), in the order its engine logs them.
std::string line(const std::array<double, WallClockBreakdown::kParts>& ms, const char* suffix) {
  using W = WallClockBreakdown;
  const double bwd = ms[W::kBackwardInner] + ms[W::kBackwardReduce];
  return fmt::format("time (ms) | fwd{0}: {1:.2f} | bwd{0}: {2:.2f} | bwd_inner{0}: {3:.2f} | bwd_allreduce{0}: {4:.2f} | "
                     "step{0}: {5:.2f}",
                     suffix, ms[W::kForward], bwd, ms[W::kBackwardInner], ms[W::kBackwardReduce], ms[W::kStep]);
}

}  // namespace

void WallClockBreakdown::start(Part part) {
  if (!enabled_) return;
  synchronize(device_);
  started_[part] = Clock::now();
}

void WallClockBreakdown::stop(Part part) {
  if (!enabled_) return;
  synchronize(device_);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started_[part]).count();
  microMs_[part] += ms;
  stepMs_[part] += ms;
}

std::string WallClockBreakdown::microStepLine() {
  std::string out = line(microMs_, "_microstep");
  microMs_.fill(0);
  return out;
}

std::vector<MonitorEvent> WallClockBreakdown::events(int64_t samples) const {
  return {{"Train/Samples/elapsed_time_ms_forward", stepMs_[kForward], samples},
          {"Train/Samples/elapsed_time_ms_backward", stepMs_[kBackwardInner] + stepMs_[kBackwardReduce], samples},
          {"Train/Samples/elapsed_time_ms_backward_inner", stepMs_[kBackwardInner], samples},
          {"Train/Samples/elapsed_time_ms_backward_allreduce", stepMs_[kBackwardReduce], samples},
          {"Train/Samples/elapsed_time_ms_step", stepMs_[kStep], samples}};
}

std::string WallClockBreakdown::stepLine() {
  std::string out = line(stepMs_, "");
  stepMs_.fill(0);
  microMs_.fill(0);
  return out;
}

}  // namespace loom::worker
