#include "worker/rollout/latency_stats.h"

#include <algorithm>

namespace loom::rollout {

void LatencyStats::Window::add(double value) {
  if (values_.size() < capacity_) {
    values_.push_back(value);
    return;
  }
  values_[next_] = value;
  next_ = (next_ + 1) % capacity_;
}

double LatencyStats::Window::percentile(double q) const {
  if (values_.empty()) return 0;
  std::vector<double> sorted = values_;
  const size_t k = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end());
  return sorted[k];
}

}  // namespace loom::rollout
