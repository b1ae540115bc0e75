#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/worker_message.h"
#include "worker/rank_context.h"

namespace loom::worker {

// The rank's voice to its node daemon: ready, progress with metrics, and a heartbeat from its own
// thread every LOOM_HEARTBEAT_MS (so a rank that is stopped or wedged falls silent). If the
// daemon stays unreachable for `orphanTimeoutMs` the rank is an orphan, and it exits rather than
// run on unsupervised. Thread-safe.
class ReportClient {
 public:
  static StatusOr<std::unique_ptr<ReportClient>> connect(const RankContext& context);
  ~ReportClient();

  void ready(const std::string& detail);
  void progress(int64_t step, const std::map<std::string, double>& metrics);
  // Something the job's events should show, without a change of state ("checkpoint refused, an
  // older one is used: ..."): a progress report carrying `what`.
  void notice(const std::string& what);
  // Why the rank is about to fail; the daemon attaches it to the rank's exit.
  void failing(const std::string& why);
  // A served rollout's rank 0 listens at `address`: every later message says so.
  void serving(const std::string& address);

 private:
  ReportClient(const RankContext& context, int fd);
  bool send(WorkerMessage message);
  void heartbeatLoop();

  RankContext context_;
  int fd_;
  int64_t orphanTimeoutMs_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  int64_t lastDeliveredMs_;
  std::string serviceAddress_;
  std::thread heartbeat_;
};

}  // namespace loom::worker
