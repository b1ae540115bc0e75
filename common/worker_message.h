#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"

namespace loom {

// What a rank process tells its node daemon, one datagram each, over the Unix socket named by
// LOOM_REPORT_SOCKET. Datagrams need no connection: a daemon that restarts simply receives the
// next one, and a stopped rank sends nothing, which is how a hang is noticed.
struct WorkerMessage {
  // kFailing: the rank is about to exit non-zero; `detail` says why (it becomes the job's reason).
  enum class Type { kHeartbeat, kReady, kProgress, kFailing };
  Type type = Type::kHeartbeat;
  std::string jobId;
  int attempt = 0;
  int rank = 0;
  int pid = 0;
  int64_t step = 0;
  std::map<std::string, double> metrics;
  std::string detail;
  // A served rollout's rank 0: where its RolloutService listens ("host:port"), in every message
  // once it serves, so that a daemon that restarted learns it again.
  std::string serviceAddress;

  std::string encode() const;
  static StatusOr<WorkerMessage> decode(const std::string& datagram);
};

}  // namespace loom
