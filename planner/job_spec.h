#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::planner {

enum class JobKind { kProbe };
enum class DeviceKind { kCpu, kCuda };

const char* jobKindName(JobKind kind);
const char* deviceKindName(DeviceKind device);

// The probe's collective benchmark (like nccl-tests): each op at sizes from minBytes to
// maxBytes, doubling, verified and timed.
struct CollectivesSpec {
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  int64_t minBytes = 8;
  int64_t maxBytes = 256 << 20;
  int iterations = 20;
  int warmup = 5;
  std::string dtype = "float32";
};

struct ProbeSpec {
  int ticks = 10;       // progress reports per rank before it exits 0
  int tickMs = 100;     // time between them
  std::optional<CollectivesSpec> collectives;
};

// DeepSpeed's comms_logger section, same keys and defaults.
struct CommsLoggerSpec {
  bool enabled = false;
  bool verbose = false;
  bool profAll = true;
  std::vector<std::string> profOps;
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
  int64_t rendezvousTimeoutMs = 300'000;  // every rank must have joined the attempt's store by then
  int64_t collectiveTimeoutMs = 1'800'000;  // the watchdog: a collective not done by then fails the attempt
  CommsLoggerSpec commsLogger;  // from deepspeed.comms_logger

  // The spec with defaults filled in: what is stored and handed to the ranks.
  nlohmann::json toJson() const;
};

// Parses and validates a spec. Unknown keys are errors, never ignored.
StatusOr<JobSpec> parseJobSpec(const std::string& specJson);

}  // namespace loom::planner
