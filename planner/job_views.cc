#include "planner/job_views.h"

#include <mutex>

namespace loom::planner {

void JobViews::publish(const JobRecord& job) {
  // The copy is made before the lock: readers wait for a pointer swap, never for a copy.
  auto view = std::make_shared<const JobRecord>(job);
  std::unique_lock lock(mu_);
  auto [it, added] = index_.try_emplace(job.id, order_.size());
  if (added) {
    order_.push_back(std::move(view));
  } else {
    order_[it->second].swap(view);
  }
  lock.unlock();
  // `view` (the replaced copy, if no reader holds it) is freed here, outside the lock.
}

JobView JobViews::find(const std::string& jobId) const {
  std::shared_lock lock(mu_);
  auto it = index_.find(jobId);
  return it == index_.end() ? nullptr : order_[it->second];
}

JobViews::Page JobViews::page(size_t start, size_t limit, const std::function<bool(const JobRecord&)>& keep) const {
  Page out;
  std::shared_lock lock(mu_);
  size_t i = start;
  for (; i < order_.size() && out.jobs.size() < limit; ++i) {
    if (keep(*order_[i])) out.jobs.push_back(order_[i]);
  }
  out.next = i;
  out.more = i < order_.size();
  return out;
}

}  // namespace loom::planner
