#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace loom::worker {

// Who this rank is, from the environment loomd launches it with (torchrun's names where they
// exist: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
struct RankContext {
  std::string jobId;
  int attempt = 0;
  std::string nodeId;
  int rank = 0;
  int localRank = 0;
  int worldSize = 0;
  int localWorldSize = 0;
  std::string masterAddr;
  int masterPort = 0;
  std::string specPath;
  std::string planPath;  // LOOM_PLAN: the job's compiled Plan (loom.v1.Plan bytes); empty for a probe
  std::string rankDir;
  std::string reportSocket;
  int64_t heartbeatMs = 1000;

  static StatusOr<RankContext> fromEnvironment();
};

}  // namespace loom::worker
