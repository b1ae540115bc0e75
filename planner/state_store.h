#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/job.h"

struct sqlite3;

namespace loom::planner {

// The planner's durable state: jobs, their events and metrics, in one SQLite file (WAL mode, so
// readers never block the writer and a crash loses no committed transaction). Every write is one
// transaction: a job and the events that explain its state are stored together or not at all.
// Not thread-safe: the planner's loop thread owns it.
class StateStore {
 public:
  static StatusOr<std::unique_ptr<StateStore>> open(const std::string& path);
  ~StateStore();

  // ALREADY_EXISTS if the id or the request id is taken.
  Status insertJob(const JobRecord& job, const std::vector<JobEvent>& events);
  Status updateJob(const JobRecord& job, const std::vector<JobEvent>& newEvents);
  Status appendMetrics(const std::string& jobId, const std::vector<Metric>& metrics);

  StatusOr<std::vector<JobRecord>> loadJobs();
  StatusOr<std::vector<JobEvent>> loadEvents(const std::string& jobId);
  // The last `limit` metrics of a job, oldest first.
  StatusOr<std::vector<Metric>> loadMetrics(const std::string& jobId, int limit);

 private:
  explicit StateStore(sqlite3* db) : db_(db) {}
  Status exec(const char* sql);
  Status writeJob(const char* sql, const JobRecord& job);
  Status insertEvents(const std::string& jobId, const std::vector<JobEvent>& events);

  sqlite3* db_;
};

}  // namespace loom::planner
