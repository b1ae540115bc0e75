#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/worker_message.h"

namespace loom::daemon {

// Receives the ranks' datagrams (common/worker_message.h) on a Unix socket and hands each to a
// callback, on the socket's own thread.
class ReportSocket {
 public:
  using Handler = std::function<void(WorkerMessage)>;
  static StatusOr<std::unique_ptr<ReportSocket>> open(const std::string& path, Handler handler);
  ~ReportSocket();
  const std::string& path() const { return path_; }

  // Runs `fn` on the socket's thread once every datagram already queued on the socket has been
  // handed to the handler: a rank's last report (sent before it exited) comes before whatever
  // `fn` does about its exit. Thread-safe.
  void afterQueued(std::function<void()> fn);

 private:
  ReportSocket(std::string path, int fd, Handler handler);
  void run();
  // Hands every datagram waiting on the socket to the handler, without blocking.
  void handleQueued(std::string& buffer);
  void handle(const std::string& buffer, ssize_t n);

  std::string path_;
  int fd_;
  int wakeFd_;   // stop
  int flushFd_;  // afterQueued
  Handler handler_;
  std::mutex mu_;
  std::vector<std::function<void()>> afterQueued_;
  std::thread thread_;
};

}  // namespace loom::daemon
