#pragma once

#include <cstddef>
#include <vector>

namespace loom::rollout {

// Time to first token (from a request's arrival) and inter-token latency, in seconds, with their
// percentiles over the newest `capacity` samples of each (a long-serving rollout forgets the old).
class LatencyStats {
 public:
  explicit LatencyStats(size_t capacity = size_t(1) << 20) : ttft_(capacity), itl_(capacity) {}

  void firstToken(double seconds) { ttft_.add(seconds); }
  void interToken(double seconds) { itl_.add(seconds); }
  double ttft(double q) const { return ttft_.percentile(q); }
  double itl(double q) const { return itl_.percentile(q); }

 private:
  class Window {
   public:
    explicit Window(size_t capacity) : capacity_(capacity) {}
    void add(double value);
    double percentile(double q) const;  // nearest rank; 0 without samples

   private:
    size_t capacity_;
    size_t next_ = 0;  // where the next sample goes once full
    std::vector<double> values_;
  };
  Window ttft_, itl_;
};

}  // namespace loom::rollout
