#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "planner/job.h"
#include "planner/plan.h"

struct sqlite3;
struct sqlite3_stmt;

namespace loom::planner {

// The planner's durable state: jobs (with the Plan of a train or eval job, as loom.v1.Plan bytes
// in the nullable jobs.plan column), their events and metrics, in one SQLite file (WAL mode, so
// readers never block the writer and a crash loses no committed transaction). A database of an
// earlier version gains the columns it lacks when opened. Every write is all or nothing: a job
// and the events that explain its state are stored together or not at all. Each write commits on
// its own unless commits are grouped (groupCommits). Not thread-safe: the planner's loop thread
// owns it.
class StateStore {
 public:
  static StatusOr<std::unique_ptr<StateStore>> open(const std::string& path);
  ~StateStore();

  // ALREADY_EXISTS if the id or the request id is taken. A train or eval job's Plan is stored
  // with it (job.hasPlan says whether there is one).
  Status insertJob(const JobRecord& job, const std::vector<JobEvent>& events, const Plan* plan = nullptr);
  // The job's state, its new events and its new metric rows, in one transaction.
  Status updateJob(const JobRecord& job, const std::vector<JobEvent>& newEvents, const std::vector<Metric>& metrics = {});

  StatusOr<std::vector<JobRecord>> loadJobs();
  StatusOr<std::vector<JobEvent>> loadEvents(const std::string& jobId);
  // The Plan stored with a job; NOT_FOUND when it has none.
  StatusOr<Plan> loadPlan(const std::string& jobId);
  // The same, as the loom.v1.Plan bytes stored (what a launch hands the ranks).
  StatusOr<std::string> loadPlanBytes(const std::string& jobId);
  // The last `limit` metrics of a job, oldest first.
  StatusOr<std::vector<Metric>> loadMetrics(const std::string& jobId, int limit);
  // Up to query.limit metrics stored after row query.afterRow, oldest first, with the row of the
  // last one (query.afterRow when none).
  StatusOr<MetricPage> loadMetricPage(const MetricQuery& query);

  // Cordoned nodes (`loomctl drain`): no new ranks are placed on them until uncordoned. A node
  // id maps to the reason given.
  Status putCordon(const std::string& nodeId, const std::string& reason, int64_t timeMs);
  Status deleteCordon(const std::string& nodeId);
  StatusOr<std::map<std::string, std::string>> loadCordons();

  // From now on a write does not commit on its own: the first opens a transaction, each is a
  // savepoint in it (a failed write still undoes itself alone), and commitGroup() commits them
  // together: one append to the WAL where there were many. Reads see the group's writes. What
  // is not yet committed is lost if the process dies: the caller commits before anything that
  // depends on those writes leaves it. Destroying the store commits what is open.
  void groupCommits() { grouping_ = true; }
  // Commits the open group (nothing to do when there is none). On failure the group's writes
  // are lost and the next write opens a new group.
  Status commitGroup();
  bool hasUncommitted() const { return groupOpen_; }

 private:
  explicit StateStore(sqlite3* db) : db_(db) {}
  Status exec(const char* sql);
  Status migrate();
  Status openGroupIfAsked();
  Status writeJob(const char* sql, const JobRecord& job);
  Status insertEvents(const std::string& jobId, const std::vector<JobEvent>& events);
  Status insertMetrics(const std::string& jobId, const std::vector<Metric>& metrics);
  // The statement for `sql` (a string literal), prepared on first use and kept; null if it
  // does not prepare.
  sqlite3_stmt* prepared(const char* sql);

  sqlite3* db_;
  std::unordered_map<const char*, sqlite3_stmt*> prepared_;
  bool grouping_ = false;
  bool groupOpen_ = false;
  bool groupLost_ = false;  // SQLite rolled back a group that a later write reopened
};

}  // namespace loom::planner
