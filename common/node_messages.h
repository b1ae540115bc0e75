#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/security/certificates.h"

// The planner <-> node daemon protocol as plain structs (proto/loom/v1/node.proto on the wire;
// proto/convert.h translates). The planner core and the daemon work with these only.
namespace loom {

enum class RankEvent { kStarted, kReady, kProgress, kExited, kHeartbeatLost, kLaunchFailed };

// Whether a rank that reported `event` still holds its slot on the node.
inline bool rankHoldsSlot(RankEvent event) { return event != RankEvent::kExited && event != RankEvent::kLaunchFailed; }

// What a node daemon says about one rank process.
struct RankReport {
  std::string jobId;
  int attempt = 0;
  int rank = 0;
  RankEvent event = RankEvent::kStarted;
  int pid = 0;
  int exitCode = 0;
  int signal = 0;
  std::string detail;
  int64_t step = 0;
  std::map<std::string, double> metrics;
  int64_t timeMs = 0;
  std::string serviceAddress;  // a served rollout's rank 0: its RolloutService (common/worker_message.h)
};

struct NodeRegistration {
  std::string nodeId;
  std::string hostname;
  std::string address;
  int slots = 0;
  std::vector<RankReport> ranks;  // the latest report of every rank the daemon holds
  std::string instanceId;         // new for every daemon process
  int gpus = 0;                   // GPUs offered, one per rank of a cuda job; 0: not counted
};

struct MasterEndpoint {
  std::string jobId;
  int attempt = 0;
  std::string address;
  int port = 0;
};

struct LogData {
  int64_t requestId = 0;
  int rank = 0;
  std::string data;
  bool done = false;
  std::string error;
};

struct RankAssignment {
  int rank = 0;
  int localRank = 0;
};

struct LaunchOrder {
  std::string jobId;
  int attempt = 0;
  std::string specJson;
  std::vector<RankAssignment> ranks;
  int worldSize = 0;
  int localWorldSize = 0;
  std::string masterAddr;
  int masterPort = 0;
  bool pickMasterPort = false;
  int64_t heartbeatTimeoutMs = 0;
  int64_t gracePeriodMs = 0;
  int groupRank = 0;  // this node's index among the attempt's nodes
  // A train or eval job's Plan as serialized loom.v1.Plan bytes (the daemon passes them on to the
  // ranks as they are); empty for a job kind without one.
  std::string plan;
  // What the planner presents to the attempt's rank 0 when it relays a call to a service the
  // rank serves (RolloutService): the rank answers no other caller (LOOM_SERVICE_TOKEN).
  std::string serviceToken;
  // The order of a served rollout's rank 0 only: the certificate and key its service listens
  // with, issued by the planner for this attempt (see planner/rank_services.h).
  security::PemPair serviceCertificate;
};

// Stops an attempt's ranks: a signal, then SIGKILL after the grace period. A preemption sends
// SIGTERM (a train rank writes a checkpoint, then exits); any other stop (cancel, a failed
// attempt) sends SIGINT, whose default action ends the rank at once.
struct KillOrder {
  std::string jobId;
  int attempt = 0;
  int64_t gracePeriodMs = 0;
  std::string reason;
  bool preempt = false;
};

struct ReleaseOrder {
  std::string jobId;
  int attempt = 0;
};

struct LogQuery {
  int64_t requestId = 0;
  std::string jobId;
  int attempt = 0;
  std::vector<int> ranks;  // empty: every rank
  int tailLines = 0;       // 0: everything
  bool follow = false;
};

}  // namespace loom
