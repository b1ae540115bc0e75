#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/node_messages.h"

namespace loom::daemon {

// Serves the planner's log requests from the rank log files under
// <jobs-dir>/<job>/attempt-<n>/rank-<r>.log: the whole file or its last N lines, then, when
// following, what is appended until the ranks have ended. One thread per request; thread-safe.
class LogServer {
 public:
  using LiveCheck = std::function<bool(const std::string& jobId, int attempt, int rank)>;
  using Sender = std::function<void(const LogData& data)>;

  LogServer(std::string jobsDir, LiveCheck isLive, Sender send);
  ~LogServer();  // cancels every request and joins

  void serve(const LogQuery& query);
  void cancel(int64_t requestId);
  void cancelAll();

  static std::string logPath(const std::string& jobsDir, const std::string& jobId, int attempt, int rank);

 private:
  struct Request {
    std::thread thread;
    std::atomic<bool> cancelled{false};
    std::atomic<bool> finished{false};
  };
  void run(LogQuery query, Request* request);
  void reapFinished();

  std::string jobsDir_;
  LiveCheck isLive_;
  Sender send_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::unique_ptr<Request>> requests_;
};

}  // namespace loom::daemon
