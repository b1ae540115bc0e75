#pragma once

#include <cstdint>
#include <string>

#include "worker/torch/model/flops_profile.h"

namespace loom::worker {

// DeepSpeed's print_model_profile at `profileStep` (its global step after the update): the
// summary, the aggregated profile (the top `topModules` classes by params, MACs and latency at
// each depth to `moduleDepth`, -1 all but the innermost) and, when `detailed`, the module tree.
struct FlopsReportContext {
  int worldSize = 1, dataParallelSize = 1, modelParallelSize = 1;
  int64_t microBatchSize = 1;
  int64_t profileStep = 0;
  // The step's engine timers (DeepSpeed's forward, backward and step global timers, seconds).
  double forwardSeconds = 0, backwardSeconds = 0, stepSeconds = 0;
  double recomputeFwdFactor = 0;
  int moduleDepth = -1, topModules = 1;
  bool detailed = true;
};
std::string flopsProfileReport(const FlopsProfile& profile, const FlopsReportContext& context);

// DeepSpeed's number formatting (its number_to_string and friends): "106.82 K", "6.29 MMACs".
std::string profilerNumber(double value);
std::string profilerParams(double params);

}  // namespace loom::worker
