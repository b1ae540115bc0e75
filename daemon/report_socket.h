#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

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

 private:
  ReportSocket(std::string path, int fd, Handler handler);
  void run();

  std::string path_;
  int fd_;
  int wakeFd_;
  Handler handler_;
  std::thread thread_;
};

}  // namespace loom::daemon
