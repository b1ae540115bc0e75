#pragma once

#include <string>

#include <c10/core/Device.h>

namespace loom::worker {

// train.profile_step: one training step under libtorch's profiler (Kineto; CUPTI on a GPU).
// The report says where that step's time went: on a GPU, the kernels' time grouped into the parts
// of a step that bench/gpu/hf_reference.py --profile uses (so the two tables sit side by side),
// then the kernels that took longest; on the CPU, the ATen operators that took longest
// (inclusive times: an operator's time holds the operators it called).
class StepProfiler {
 public:
  explicit StepProfiler(c10::Device device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Stops recording; `wallMs` is the step's wall time. A markdown report for the rank's log.
  std::string report(double wallMs);

 private:
  c10::Device device_;
  bool recording_ = false;
};

}  // namespace loom::worker
