#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/job.h"

namespace loom::planner {

// A job as it was last stored: immutable, shared by every reader that holds it.
using JobView = std::shared_ptr<const JobRecord>;

// The jobs as last committed, for readers on any thread. GetJob, ListJobs and every access check
// answer from here instead of queueing behind the planner's loop, which places jobs, stores
// reports and takes a thousand heartbeats a second; the loop publishes a job's copy each time it
// stores the job, so a reader sees what the database holds, never a change half made.
class JobViews {
 public:
  // A new job is appended (creation order); a known one is replaced in its place.
  void publish(const JobRecord& job);
  JobView find(const std::string& jobId) const;

  struct Page {
    std::vector<JobView> jobs;
    size_t next = 0;    // where the next page starts
    bool more = false;  // whether any job lies there
  };
  // Up to `limit` jobs that `keep` admits, from position `start` of the creation order.
  Page page(size_t start, size_t limit, const std::function<bool(const JobRecord&)>& keep) const;
 private:
  mutable std::shared_mutex mu_;
  std::vector<JobView> order_;                      // creation order
  std::unordered_map<std::string, size_t> index_;  // job id -> place in order_
};

}  // namespace loom::planner
