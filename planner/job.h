#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/node_messages.h"
#include "planner/job_spec.h"

namespace loom::planner {

using loom::RankEvent;
using loom::RankReport;

enum class JobState { kPending, kLaunching, kRunning, kRestarting, kCancelling, kSucceeded, kFailed, kCancelled };
enum class RankState { kLaunching, kRunning, kSucceeded, kFailed };

const char* jobStateName(JobState state);
const char* rankStateName(RankState state);
bool isFinal(JobState state);
// States in which an attempt's ranks may still be alive somewhere.
bool hasLiveAttempt(JobState state);

struct RankStatus {
  int rank = 0;
  std::string nodeId;
  int pid = 0;
  RankState state = RankState::kLaunching;
  int exitCode = 0;
  int signal = 0;
  std::string detail;
  int64_t step = 0;
  std::string serviceAddress;  // a served rollout's rank 0: where the planner routes RolloutService calls
  std::map<std::string, double> metrics;  // the latest value of each metric this rank reported (not stored)

  // Ended by a preemption (process::isPreemption of its exit), not by a failure.
  bool preempted() const;
};

struct JobEvent {
  int64_t seq = 0;
  int64_t timeMs = 0;
  JobState state = JobState::kPending;
  int attempt = 0;
  std::string reason;
};

struct Metric {
  int attempt = 0;
  int rank = 0;
  int64_t step = 0;
  std::string name;
  double value = 0;
  int64_t timeMs = 0;
};

// Which stored metrics of a job to read, from where (a page's position is the store's row id).
struct MetricQuery {
  std::string jobId;
  std::vector<std::string> names;  // empty: all
  std::vector<int> ranks;          // empty: all
  int64_t afterRow = 0;
  int limit = 10'000;
};

struct MetricPage {
  std::vector<Metric> metrics;
  int64_t lastRow = 0;
  bool more = false;  // rows after lastRow are stored already
};

struct JobRecord {
  std::string id;
  std::string requestId;
  std::string specJson;  // normalized: every default filled in
  JobSpec spec;
  std::string tenant;  // whose job it is: its users see it (empty: no tenant's, an admin's)
  std::string owner;   // the user that submitted it
  JobState state = JobState::kPending;
  std::string reason;
  int attempt = 0;   // 0 until first placed
  int restarts = 0;        // relaunches counted against spec.maxRestarts
  int preemptions = 0;     // attempts ended by a preemption (relaunched without counting, spec.restartOnPreemption)
  int preemptedAttempt = 0;  // the last attempt a preemption ended: its relaunch does not count
  int64_t createTimeMs = 0;
  int64_t updateTimeMs = 0;
  std::vector<RankStatus> ranks;  // of the current attempt
  std::map<std::string, double> metrics;
  int64_t lastEventSeq = 0;
  // A train or eval job's Plan was compiled and stored with it (StateStore::loadPlan reads it;
  // it is not kept in memory, being as large as the model has tensors).
  bool hasPlan = false;
};

struct NodeRanks {
  std::string nodeId;
  std::vector<int> ranks;  // global ranks placed on this node, ascending; local rank = index
};
using Placement = std::vector<NodeRanks>;

}  // namespace loom::planner
