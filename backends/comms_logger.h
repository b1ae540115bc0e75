#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace loom::backends {

// DeepSpeed's `comms_logger` settings, same keys and defaults.
struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;      // log every operation as it completes
  bool profAll = true;       // record every operation ...
  std::set<std::string> profOps;  // ... or, when prof_all is false, only these (Loom's op names:
                                  // the spec maps DeepSpeed's, e.g. all_gather_into_tensor)
};

// Per-operation counts, bytes, latency, algbw and busbw, by op and message size. Bus bandwidth
// follows nccl-tests: all_reduce moves 2(n-1)/n of the data per rank, all_gather, reduce_scatter
// and all_to_all (n-1)/n, broadcast and point-to-point all of it. Thread-safe.
class CommsLogger {
 public:
  explicit CommsLogger(CommsLoggerConfig config) : config_(std::move(config)) {}

  bool wants(const std::string& op) const;
  void record(const std::string& op, int64_t bytes, int groupSize, double seconds);
  // A table, one line per (op, size): count, total bytes, mean latency, algbw, busbw.
  std::string summary() const;
  // "comm.<op>.count", "comm.<op>.bytes", "comm.<op>.busbw_GBps" (gigabytes per second, over the
  // op's calls together).
  std::map<std::string, double> metrics() const;

  static double busBandwidthFactor(const std::string& op, int groupSize);

 private:
  struct Stats {
    int64_t count = 0;
    int64_t bytes = 0;
    double seconds = 0;
    double busBytes = 0;
  };
  CommsLoggerConfig config_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int64_t>, Stats> bySize_;
};

}  // namespace loom::backends
