#include "backends/comms_logger.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/human_bytes.h"

namespace loom::backends {

double CommsLogger::busBandwidthFactor(const std::string& op, int n) {
  if (n <= 1) return 0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all" || op == "all_to_all_v")
    return double(n - 1) / n;
  return 1.0;
}

bool CommsLogger::wants(const std::string& op) const {
  return config_.enabled && (config_.profAll || config_.profOps.count(op));
}

void CommsLogger::record(const std::string& op, int64_t bytes, int groupSize, double seconds) {
  if (!wants(op)) return;
  double bus = bytes * busBandwidthFactor(op, groupSize);
  if (config_.verbose) {
    spdlog::info("comm op: {} | size {} | group {} | time {:.3f} ms | algbw {:.3f} GB/s | busbw {:.3f} GB/s", op,
                 humanBytes(bytes), groupSize, seconds * 1e3, seconds > 0 ? bytes / seconds / 1e9 : 0.0,
                 seconds > 0 ? bus / seconds / 1e9 : 0.0);
  }
  std::lock_guard lock(mu_);
  Stats& s = bySize_[{op, bytes}];
  s.count += 1;
  s.bytes += bytes;
  s.seconds += seconds;
  s.busBytes += bus;
}

std::string CommsLogger::summary() const {
  std::lock_guard lock(mu_);
  std::string out = fmt::format("{:<16} {:>12} {:>8} {:>14} {:>12} {:>12} {:>12}\n", "op", "size", "count",
                                "total", "avg ms", "algbw GB/s", "busbw GB/s");
  for (const auto& [key, s] : bySize_) {
    double t = s.seconds / s.count;
    out += fmt::format("{:<16} {:>12} {:>8} {:>14} {:>12.3f} {:>12.3f} {:>12.3f}\n", key.first, humanBytes(key.second),
                       s.count, humanBytes(s.bytes), t * 1e3, s.seconds > 0 ? s.bytes / s.seconds / 1e9 : 0.0,
                       s.seconds > 0 ? s.busBytes / s.seconds / 1e9 : 0.0);
  }
  return out;
}

std::map<std::string, double> CommsLogger::metrics() const {
  std::lock_guard lock(mu_);
  std::map<std::string, Stats> byOp;
  for (const auto& [key, s] : bySize_) {
    Stats& t = byOp[key.first];
    t.count += s.count;
    t.bytes += s.bytes;
    t.seconds += s.seconds;
    t.busBytes += s.busBytes;
  }
  std::map<std::string, double> out;
  for (const auto& [op, s] : byOp) {
    out["comm." + op + ".count"] = static_cast<double>(s.count);
    out["comm." + op + ".bytes"] = static_cast<double>(s.bytes);
    out["comm." + op + ".busbw_GBps"] = s.seconds > 0 ? s.busBytes / s.seconds / 1e9 : 0;
  }
  return out;
}

}  // namespace loom::backends
