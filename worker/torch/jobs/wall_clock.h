#pragma once

#include <array>
#include <chrono>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "worker/monitor/monitors.h"

namespace loom::worker {

// DeepSpeed's wall_clock_breakdown: its engine's timers over a step's parts, the device
// synchronized around each (as DeepSpeed's synchronized timers do), and the lines its
// SynchronizedWallClockTimer.log prints on rank 0: after each micro-batch
//   time (ms) | fwd_microstep: 12.50 | bwd_microstep: 20.10 | bwd_inner_microstep: 20.10 | ...
// and after each optimizer step the sums over its micro-batches
//   time (ms) | fwd: 50.00 | bwd: 81.20 | bwd_inner: 80.40 | bwd_allreduce: 0.80 | step: 3.10
// Loom's parts: fwd the model's loss, bwd_inner its backward (and the ZeRO engine's accumulation),
// bwd_allreduce the gradients' reduction, bwd the two, step the optimizer step. Disabled, it
// times nothing and synchronizes nothing.
class WallClockBreakdown {
 public:
  enum Part { kForward, kBackwardInner, kBackwardReduce, kStep, kParts };

  WallClockBreakdown(c10::Device device, bool enabled) : device_(device), enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  void start(Part part);
  void stop(Part part);
  // The line of the micro-batch that ended; its timers restart.
  std::string microStepLine();
  // DeepSpeed's monitor events of the step (elapsed_time_ms_*), before stepLine() resets them.
  std::vector<MonitorEvent> events(int64_t samples) const;
  // The line of the step that ended; its timers restart.
  std::string stepLine();

 private:
  using Clock = std::chrono::steady_clock;
  c10::Device device_;
  bool enabled_;
  std::array<Clock::time_point, kParts> started_{};
  std::array<double, kParts> microMs_{};
  std::array<double, kParts> stepMs_{};
};

}  // namespace loom::worker
