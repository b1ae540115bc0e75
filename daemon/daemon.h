#pragma once

#include <map>
#include <memory>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/event_loop.h"
#include "common/process.h"
#include "common/status.h"
#include "daemon/log_server.h"
#include "daemon/planner_link.h"
#include "daemon/rank_record.h"
#include "daemon/report_socket.h"

namespace loom::daemon {

// What loomd's /metrics shows (node_metrics.h), copied on the daemon's loop.
struct NodeSnapshot {
  struct Rank {
    std::string jobId;
    int attempt = 0;
    int rank = 0;
    int pid = 0;
    int64_t step = 0;
  };
  std::string nodeId;
  int slots = 0;
  bool plannerConnected = false;
  int64_t plannerRegistrations = 0;  // the link's (re)connections
  int64_t launches = 0;
  std::map<std::string, int64_t> exits;  // by outcome: succeeded, failed, preempted, launch_failed
  int64_t reportsRelayed = 0;            // rank reports sent up the link
  std::vector<Rank> liveRanks;
};

struct DaemonOptions {
  std::string stateDir;
  std::string nodeId;           // default: the host name
  std::string address;          // where other nodes reach this one; empty: the address the
                                // planner sees this daemon's stream come from
  int slots = 0;                // ranks this node runs at once
  std::string workerPath;       // the loom-worker binary
  // Where ranks find the kernel plugins their jobs name (LOOM_KERNEL_DIRS); empty: the worker's
  // own defaults (kernels/loader.h).
  std::vector<std::string> kernelDirs;
  // The GPUs this node offers, by CUDA index (PCI bus order): each rank of a cuda job takes one,
  // and sees its attempt's GPUs on this node through CUDA_VISIBLE_DEVICES, so two jobs never
  // share one. An index given twice is two slots on one GPU. Empty: GPUs are not counted.
  std::vector<int> gpus;
  // The unprivileged user ranks run as (loomd --run-as); none: loomd's own. The ranks' scratch
  // directories and the report socket are theirs; the state directory must let them in.
  std::optional<process::RunAs> runAs;
  int64_t tickMs = 100;         // how often ranks are checked (exits, heartbeats, kill deadlines)

  Status validate() const;
};

// loomd's core: launches the rank processes the planner orders, watches them (exit, heartbeats),
// stops them (SIGTERM, grace, SIGKILL to the whole process group), keeps their logs, and reports
// all of it up the planner link. State lives on one loop thread; records are persisted under
// <state-dir>/ranks so that a restarted daemon re-adopts live ranks and reports ended ones.
class Daemon final : public PlannerOrders {
 public:
  static StatusOr<std::unique_ptr<Daemon>> start(const DaemonOptions& options, std::shared_ptr<grpc::Channel> planner,
                                                 const Clock* clock);
  ~Daemon() override;

  // Leaves the ranks running (a restarted daemon re-adopts them) and stops.
  void shutdown();
  // Waits until no rank process of this daemon is alive; false if some still are at `timeoutMs`.
  bool awaitNoLiveRanks(int64_t timeoutMs);
  // Preempts this node's ranks before the daemon stops (loomd --drain-on-sigterm): the planner
  // cordons the node and sends SIGTERM to every rank of the attempts here, wherever they run. Without
  // a planner to tell, the ranks here get SIGTERM directly. Then wait with awaitNoLiveRanks.
  void drain();
  // The counters and live ranks, for /metrics.
  void snapshot(std::function<void(NodeSnapshot)> done);

  // PlannerOrders
  NodeRegistration registration() override;
  void onLaunch(LaunchOrder order) override;
  void onKill(KillOrder order) override;
  void onRelease(ReleaseOrder order) override;
  void onLogRequest(LogQuery query) override;
  void onLogCancel(int64_t requestId) override;
  void onDisconnected() override;

 private:
  Daemon(const DaemonOptions& options, const Clock* clock);
  Status recoverRecords();
  // `gpu`: the GPU the rank holds (-1: none); `visibleGpus`: its CUDA_VISIBLE_DEVICES.
  void launchRank(const LaunchOrder& order, const RankAssignment& assignment, const std::string& attemptDir, int gpu,
                  const std::string& visibleGpus);
  // The GPUs for a launch's ranks, by local rank (empty when the job is not a cuda job or the
  // node does not count GPUs); FailedPrecondition when too few are free.
  StatusOr<std::vector<int>> assignGpus(const LaunchOrder& order) const;
  void onWorkerMessage(const WorkerMessage& message);
  void tick();
  void markExited(RankRecord& record, int exitCode, int signal, const std::string& detail);
  // markExited for a rank tick() reaped, once its queued datagrams are handled.
  void reportReaped(const std::string& key);
  void report(RankRecord& record, RankEvent event, const std::string& detail = "");
  void persist(const RankRecord& record);
  std::string attemptDir(const std::string& jobId, int attempt) const;
  std::string recordPath(const RankRecord& record) const;

  DaemonOptions options_;
  const Clock* clock_;
  std::string instanceId_;
  std::map<std::string, RankRecord> ranks_;  // by RankRecord::key()
  NodeSnapshot counters_;                    // its counters and link state (liveRanks unused)
  std::unique_ptr<ReportSocket> reports_;
  std::unique_ptr<LogServer> logs_;
  std::unique_ptr<PlannerLink> link_;
  std::unique_ptr<EventLoop> loop_;
};

}  // namespace loom::daemon
