#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::planner {

enum class JobKind { kProbe };
enum class DeviceKind { kCpu, kCuda };

const char* jobKindName(JobKind kind);
const char* deviceKindName(DeviceKind device);

struct ProbeSpec {
  int ticks = 10;       // progress reports per rank before it exits 0
  int tickMs = 100;     // time between them
};

// A job spec as submitted (JSON), validated and with every default filled in. Field names in
// errors are the spec's own JSON paths ("resources.ranks") so a user can find them.
struct JobSpec {
  std::string name;
  JobKind kind = JobKind::kProbe;
  int ranks = 0;
  DeviceKind device = DeviceKind::kCpu;
  ProbeSpec probe;
  int maxRestarts = 0;
  int64_t gracePeriodMs = 10'000;       // SIGTERM, then SIGKILL after this long
  int64_t heartbeatTimeoutMs = 30'000;  // a rank silent for this long fails the attempt

  // The spec with defaults filled in: what is stored and handed to the ranks.
  nlohmann::json toJson() const;
};

// Parses and validates a spec. Unknown keys are errors, never ignored.
StatusOr<JobSpec> parseJobSpec(const std::string& specJson);

}  // namespace loom::planner
