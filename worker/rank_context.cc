#include "worker/rank_context.h"

#include <cstdlib>

namespace loom::worker {

namespace {

StatusOr<std::string> requireEnv(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return invalidArgument("{} is not set (loom-worker is started by loomd, which sets it)", name);
  return std::string(v);
}

StatusOr<int64_t> requireInt(const char* name, int64_t min) {
  ASSIGN_OR_RETURN(std::string text, requireEnv(name));
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || v < min) return invalidArgument("{}: expected an integer >= {}, got \"{}\"", name, min, text);
  return static_cast<int64_t>(v);
}

}  // namespace

StatusOr<RankContext> RankContext::fromEnvironment() {
  RankContext c;
  ASSIGN_OR_RETURN(c.jobId, requireEnv("LOOM_JOB_ID"));
  ASSIGN_OR_RETURN(int64_t attempt, requireInt("LOOM_ATTEMPT", 1));
  ASSIGN_OR_RETURN(int64_t rank, requireInt("RANK", 0));
  ASSIGN_OR_RETURN(int64_t localRank, requireInt("LOCAL_RANK", 0));
  ASSIGN_OR_RETURN(int64_t world, requireInt("WORLD_SIZE", 1));
  ASSIGN_OR_RETURN(int64_t localWorld, requireInt("LOCAL_WORLD_SIZE", 1));
  ASSIGN_OR_RETURN(int64_t masterPort, requireInt("MASTER_PORT", 0));
  ASSIGN_OR_RETURN(c.masterAddr, requireEnv("MASTER_ADDR"));
  ASSIGN_OR_RETURN(c.specPath, requireEnv("LOOM_SPEC"));
  ASSIGN_OR_RETURN(c.rankDir, requireEnv("LOOM_RANK_DIR"));
  ASSIGN_OR_RETURN(c.reportSocket, requireEnv("LOOM_REPORT_SOCKET"));
  ASSIGN_OR_RETURN(c.heartbeatMs, requireInt("LOOM_HEARTBEAT_MS", 1));
  if (rank >= world) return invalidArgument("RANK {} is not below WORLD_SIZE {}", rank, world);
  c.attempt = static_cast<int>(attempt);
  c.rank = static_cast<int>(rank);
  c.localRank = static_cast<int>(localRank);
  c.worldSize = static_cast<int>(world);
  c.localWorldSize = static_cast<int>(localWorld);
  c.masterPort = static_cast<int>(masterPort);
  const char* plan = std::getenv("LOOM_PLAN");
  c.planPath = plan ? plan : "";
  const char* node = std::getenv("LOOM_NODE_ID");
  c.nodeId = node ? node : "";
  return c;
}

}  // namespace loom::worker
