#pragma once

#include <chrono>
#include <memory>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/model/flops_report.h"

namespace loom::worker {

// deepspeed.flops_profiler in a train job, as DeepSpeed's engine runs it: on rank 0, at the step
// whose global_steps (optimizer steps taken, from 0) is profile_step, every micro-batch's forward
// is profiled afresh (DeepSpeed resets the profile at each forward, so the last one's remains)
// and the step's forward, backward and update are timed; after the update the report goes to
// rank 0's log, or to output_file.
class FlopsProfilerStep {
 public:
  FlopsProfilerStep(const planner::DeepSpeedConfig& ds, int rank, DecoderModel& model)
      : config_(ds.flopsProfiler), microBatchSize_(ds.microBatchSize), active_(ds.flopsProfiler.enabled && rank == 0),
        model_(model) {}

  // Whether the step that `stepsTaken` optimizer steps precede is the profiled one.
  bool profiles(int64_t stepsTaken) const { return active_ && stepsTaken == config_.profileStep; }

  enum Part { kForward, kBackward, kStep };
  // Around one part of the profiled step (the forward also records into a fresh profile); inert
  // on other steps.
  class Timed {
   public:
    Timed(FlopsProfilerStep& owner, bool profiling, Part part);
    ~Timed();
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    FlopsProfilerStep* owner_ = nullptr;
    Part part_ = kForward;
    std::chrono::steady_clock::time_point start_;
  };

  // After the profiled step's update: the report (DeepSpeed prints global_steps after the update).
  Status report(int64_t stepsAfter, int worldSize, int dataParallelSize, int modelParallelSize);

 private:
  planner::FlopsProfilerConfig config_;
  int64_t microBatchSize_;
  bool active_;
  DecoderModel& model_;
  std::unique_ptr<FlopsProfile> profile_;
  double seconds_[3] = {0, 0, 0};
};

}  // namespace loom::worker
