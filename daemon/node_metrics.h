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

// Who may scrape, and how: a scraper presents `token` as "Authorization: Bearer TOKEN" (as
// Prometheus' `authorization.credentials_file` sends it; empty: anyone), over HTTPS when a
// certificate and key are given.
struct NodeMetricsAccess {
  std::string token;
  std::string tlsCertFile;
  std::string tlsKeyFile;
};

class NodeMetricsServer {
 public:
  static StatusOr<std::unique_ptr<NodeMetricsServer>> start(const std::string& listenAddress, Daemon* daemon,
                                                            const NodeMetricsAccess& access);
  ~NodeMetricsServer();
  const std::string& boundAddress() const;

 private:
  NodeMetricsServer() = default;
  std::unique_ptr<HttpListener> listener_;
};

}  // namespace loom::daemon
