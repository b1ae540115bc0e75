#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "daemon/daemon.h"

namespace loom {
class HttpListener;
}

namespace loom::daemon {

// loomd's /metrics (`loomd --metrics-listen`): the node's slots and live ranks, launches and
// exits by outcome, the planner link, and per live rank its step, resident memory and CPU time
// (read from /proc at scrape time, so they are the processes' own).
std::string renderNodeMetrics(const NodeSnapshot& snapshot);

class NodeMetricsServer {
 public:
  static StatusOr<std::unique_ptr<NodeMetricsServer>> start(const std::string& listenAddress, Daemon* daemon);
  ~NodeMetricsServer();
  const std::string& boundAddress() const;

 private:
  NodeMetricsServer() = default;
  std::unique_ptr<HttpListener> listener_;
};

}  // namespace loom::daemon
