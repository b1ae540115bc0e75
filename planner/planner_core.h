#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/event_loop.h"
#include "common/status.h"
#include "planner/tenants.h"
#include "planner/job.h"
#include "planner/job_lifecycle.h"
#include "planner/job_views.h"
#include "planner/node_link.h"
#include "planner/placement.h"
#include "planner/quotas.h"
#include "planner/rank_services.h"
#include "planner/state_store.h"

namespace loom::planner {

struct JobUpdate {
  JobRecord job;
  std::vector<JobEvent> events;  // new since the last update (all of them in the first)
  std::vector<Metric> metrics;   // likewise
};

// Receives a job's updates; owned jointly by the core and the stream that feeds a client.
class JobWatcher {
 public:
  virtual ~JobWatcher() = default;
  // False when the watcher is gone (client left): the core drops it.
  virtual bool onUpdate(const JobUpdate& update) = 0;
  virtual void onEnd(const Status& status) = 0;
};

// Receives the chunks of one log request.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual bool onChunk(int rank, int attempt, const std::string& data) = 0;
  virtual void onEnd(const Status& status) = 0;
};

struct NodeView {
  std::string nodeId;
  std::string hostname;
  std::string address;
  int slots = 0;
  int usedSlots = 0;
  int gpus = 0;  // 0: not counted (cuda ranks take slots only)
  int usedGpus = 0;
  bool connected = false;
  int64_t lastSeenMs = 0;
  bool cordoned = false;     // no new ranks are placed here (drained)
  std::string cordonReason;
};

struct ListQuery {
  int pageSize = 100;
  std::string pageToken;
  std::set<JobState> states;
  std::optional<std::string> tenant;  // only this tenant's jobs (a user's view); none: every job
};

// Who submits a job: its tenant's users see it (an admin's job belongs to no tenant).
struct JobOwner {
  std::string tenant;
  std::string user;
};

struct JobPage {
  std::vector<JobView> jobs;
  std::string nextPageToken;
};

// What /metrics shows of the planner's state, copied on its loop.
struct ClusterSnapshot {
  // tenant ("": admins' jobs) → state → jobs
  std::map<std::string, std::map<JobState, int>> jobsByTenant;
  int64_t restarts = 0;     // over every job: relaunches after a failed attempt
  int64_t preemptions = 0;  // and after a preemption
  std::vector<JobRecord> liveJobs;  // jobs whose attempt may have ranks alive
  std::vector<NodeView> nodes;
};

struct PlannerOptions {
  std::string stateDir;
  std::map<std::string, TenantQuota> quotas;  // by tenant (tenants.h); a job over its quota waits
  int64_t nodeTimeoutMs = 15'000;        // a node silent this long has lost its ranks
  int64_t nodeHeartbeatIntervalMs = 1'000;

  Status validate() const;
};

// The planner's state and decisions: the job registry (persisted, a train or eval job with its
// compiled Plan), the node registry, gang placement, the job state machine and restarts. All state belongs to one loop thread; every
// public method is thread-safe, posts to that loop and answers through its callback, which runs
// on the loop (so callbacks must not block) — but for the reads of jobs (job(), listJobs()),
// which answer at once from the views the loop publishes.
//
// Writes are committed together, once per turn of the loop (a turn's rank reports in one
// transaction, not one each), and never after something that depends on them has left: an
// order to a daemon waits in the outbox, and a reply or a watcher's update commits first
// (makeDurable). A crash loses only what nobody outside was told: the turn under way, whose rank
// reports the daemons send again when they re-register.
class PlannerCore {
 public:
  static StatusOr<std::unique_ptr<PlannerCore>> create(const PlannerOptions& options, const Clock* clock);
  ~PlannerCore();

  using JobCallback = std::function<void(const StatusOr<JobRecord>&)>;
  // A request id is the owner's tenant's: the same id from two tenants makes two jobs.
  void createJob(std::string specJson, std::string requestId, JobOwner owner,
                 std::function<void(const StatusOr<JobRecord>&, bool created)> done);
  // The job as last stored (NOT_FOUND if there is none). Answered on the caller's thread, from
  // the views the loop publishes: reads never wait behind placement, reports or heartbeats.
  StatusOr<JobView> job(const std::string& jobId) const;
  // The Plan stored with a train or eval job (NOT_FOUND for a probe job).
  void getJobPlan(const std::string& jobId, std::function<void(const StatusOr<Plan>&)> done);
  // A page of jobs in creation order; like job(), on the caller's thread.
  StatusOr<JobPage> listJobs(const ListQuery& query) const;
  // A page of a job's stored metrics (NOT_FOUND for an unknown job).
  void listJobMetrics(MetricQuery query, std::function<void(const StatusOr<MetricPage>&)> done);
  void cancelJob(const std::string& jobId, std::string reason, JobCallback done);
  void watchJob(const std::string& jobId, std::shared_ptr<JobWatcher> watcher);
  void streamLogs(LogQuery query, std::shared_ptr<LogSink> sink);
  void stopLogs(const std::shared_ptr<LogSink>& sink);
  void listNodes(std::function<void(std::vector<NodeView>)> done);
  void snapshot(std::function<void(ClusterSnapshot)> done);
  // Called on the loop with the seconds each job waited to be placed (from PENDING or RESTARTING).
  void setPlacementObserver(std::function<void(double)> observer);
  // `loomctl drain`: the node is cordoned (stored: it outlives a planner restart) and every
  // attempt with a rank on it is preempted (JobLifecycle::preempt). NOT_FOUND for a node that
  // never attached.
  void drainNode(const std::string& nodeId, std::string reason, std::function<void(const StatusOr<NodeView>&)> done);
  // Lifts the cordon; the node takes ranks again.
  void uncordonNode(const std::string& nodeId, std::function<void(const StatusOr<NodeView>&)> done);

  // The node side, called by the Attach streams. A link is registered by its first message.
  void nodeRegistered(std::shared_ptr<NodeLink> link, NodeRegistration registration);
  // Answered on the caller's thread: the link notes the time (NodeLink::heard), the loop is not woken.
  void nodeHeartbeat(const std::shared_ptr<NodeLink>& link);
  void rankReported(const std::shared_ptr<NodeLink>& link, RankReport report);
  void masterEndpointReported(const std::shared_ptr<NodeLink>& link, MasterEndpoint endpoint);
  void logDataReceived(const std::shared_ptr<NodeLink>& link, LogData data);
  // The daemon is stopping and preempts its ranks first (loomd --drain-on-sigterm): as a drain,
  // but not stored, and lifted when the node's next daemon attaches.
  void nodeDraining(const std::shared_ptr<NodeLink>& link);
  void nodeDetached(const std::shared_ptr<NodeLink>& link);

  int64_t nodeHeartbeatIntervalMs() const { return options_.nodeHeartbeatIntervalMs; }
  // How the planner reaches the services of an attempt's rank 0 (RolloutService). Thread-safe:
  // set once at open.
  const RankServiceAuthority& rankServices() const { return rankServices_; }

  // Ends every stream (watchers, log readers, node links) so that the gRPC server can stop.
  void closeStreams();
  // Stops the loop; calls after this are answered UNAVAILABLE or dropped.
  void shutdown();

 private:
  struct Node {
    NodeView view;
    std::shared_ptr<NodeLink> link;  // null while detached
    std::string instanceId;
    int64_t detachedSinceMs = 0;
    std::set<std::tuple<std::string, int, int>> liveRanks;  // (job, attempt, rank) holding a slot
  };
  struct PendingLaunch {
    int attempt = 0;
    std::vector<LaunchOrder> orders;  // for the nodes without rank 0, sent once its port is known
  };
  struct Cordon {
    std::string reason;
    bool stored = false;  // from drainNode; else the daemon's own drain, lifted by its next registration
  };
  struct LogStream {
    std::shared_ptr<LogSink> sink;
    std::string jobId;
    int attempt = 0;
    std::set<std::string> waitingNodes;
  };

  PlannerCore(const PlannerOptions& options, const Clock* clock, std::unique_ptr<StateStore> store, int lockFd);
  Status recover();
  JobRecord* findJob(const std::string& jobId);
  Node* nodeOfLink(const std::shared_ptr<NodeLink>& link);
  std::string newJobId(const std::string& name);

  // Persists a step's events, notifies watchers and carries out its effects.
  void commit(JobRecord& job, const LifecycleEffects& effects, std::vector<Metric> metrics = {});
  // Commits the writes made so far, shows the jobs they changed to readers (views_), then sends
  // the orders waiting in the outbox. At the end of every turn, and before any reply or update
  // that tells the outside what was written.
  void makeDurable();
  // An order to a daemon, sent by makeDurable() once the writes before it are committed.
  void sendAfterCommit(const std::shared_ptr<NodeLink>& link, std::function<void(NodeLink&)> order);
  void stopAttempt(JobRecord& job, const std::string& reason, bool preempt);
  void abandonPendingLaunch(JobRecord& job);
  void releaseAttempt(const JobRecord& job);
  // Every attached node's free and total slots.
  // What each attached node can take now: slots, or for a cuda job on a node that counts its
  // GPUs, the fewer of its free slots and free GPUs.
  std::vector<NodeCapacity> nodeCapacity(bool cuda = false) const;
  int usedGpus(const Node& node) const;  // ranks of cuda jobs on it
  // What each tenant's running jobs hold (their live ranks), for its quota.
  std::map<std::string, TenantUsage> tenantUsage() const;
  // Sets (or, null, clears) a node's link and the index from links to nodes.
  void setLink(Node& node, std::shared_ptr<NodeLink> link);
  // Stamps `link` with the time now: the daemon spoke on it (registration, heartbeat, report).
  void noteHeard(NodeLink& link) const;
  // Puts a PENDING job in the placement queue (schedule() drops it once it is not).
  void queueIfPending(const JobRecord& job);
  void schedule();
  void launch(JobRecord& job, const Placement& placement);
  void reconcileNode(Node& node, const NodeRegistration& registration);
  void expireNodes();
  void applyReport(const std::string& nodeId, const RankReport& report);
  void releaseIfOver(Node& node, const RankReport& report);
  void notifyWatchers(const JobRecord& job, const std::vector<JobEvent>& events, const std::vector<Metric>& metrics);
  void cordon(const std::string& nodeId, Cordon cordon);
  // Preempts every attempt with a rank on the node.
  void preemptJobsOn(const std::string& nodeId, const std::string& why);
  NodeView viewOf(const std::string& nodeId) const;

  PlannerOptions options_;
  RankServiceAuthority rankServices_;  // from STATE_DIR, made on first start
  const Clock* clock_;
  std::unique_ptr<StateStore> store_;
  std::map<std::string, JobRecord> jobs_;
  std::map<std::string, int64_t> waitingSinceMs_;  // jobs waiting for placement: since when
  std::function<void(double)> placementObserver_;
  std::vector<std::string> jobOrder_;  // creation order
  JobViews views_;                     // what readers on other threads see of jobs_
  std::vector<std::string> unpublished_;  // jobs written this turn, in order: published once committed
  // Orders to daemons, in the order given, waiting for the commit of the writes before them.
  std::vector<std::pair<std::shared_ptr<NodeLink>, std::function<void(NodeLink&)>>> outbox_;
  std::unordered_map<const NodeLink*, std::string> nodeByLink_;  // attached links: whose node
  std::unordered_map<std::string, size_t> creationIndex_;      // a job's place in jobOrder_
  std::set<std::pair<size_t, std::string>> placementQueue_;  // PENDING jobs by creation: FIFO placement
  std::map<std::string, std::string> jobByRequestId_;
  std::map<std::string, Node> nodes_;
  std::map<std::string, Cordon> cordons_;  // by node id; a node may be cordoned before it attaches
  std::map<std::string, PendingLaunch> pendingLaunches_;
  std::multimap<std::string, std::shared_ptr<JobWatcher>> watchers_;
  std::map<int64_t, LogStream> logStreams_;
  int64_t nextLogRequestId_;  // starts from the time: ids of an earlier planner run are not reused
  int lockFd_;                // flock on <state-dir>/planner.lock: one planner per state dir
  std::unique_ptr<EventLoop> loop_;  // last: destroyed (joined) first
};

}  // namespace loom::planner
