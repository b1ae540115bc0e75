#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/clock.h"
#include "common/security/credentials.h"
#include "common/security/tokens.h"
#include "common/status.h"
#include "planner/planner_core.h"

namespace loom::planner {

class AccessControl;
class CallGate;
class JobServiceImpl;
class NodeServiceImpl;
class PlannerMetrics;
class RolloutRouter;
class WebServer;

struct PlannerServerOptions {
  std::string listenAddress = "127.0.0.1:7450";  // port 0 picks a free one; see boundAddress()
  // Where /metrics, the JSON API and the web page are served (web_server.h); empty: nowhere.
  std::string httpListenAddress;
  // When the HTTP address cannot be bound: fail to start (an address the user chose), or log
  // a warning and serve gRPC alone (the default address, which another planner may hold).
  bool httpRequired = true;
  PlannerOptions planner;

  // Security (docs/security.md). TLS for gRPC, and mutual TLS when it names a client CA.
  security::ServerTls tls;
  // The tokens file (access_control.h); empty: the planner's own, generated into its state dir.
  std::string tokensFile;
  // The tenants file (tenants.h): each tenant's directories and quotas. Without one a user's
  // spec may name no path (an admin's are not confined).
  std::string tenantsFile;
  // Plain text on an address other than loopback: refused unless this is set, and then warned
  // about at start and on every node's attach.
  bool insecure = false;
  // gRPC server reflection (grpcurl's listing of the services); off unless asked for.
  bool reflection = false;
};

// The planner service: the core plus its gRPC server (JobService, NodeService, RolloutService
// relayed to served rollouts (rollout_router.h), grpc.health.v1 and, when asked for, server
// reflection) and its web server (/metrics, the JSON API, the web page). Every call but the
// health check is authenticated (access_control.h). Used by loom-planner and, in process, by
// `loomd --standalone` and `loomctl run`.
class PlannerServer {
 public:
  static StatusOr<std::unique_ptr<PlannerServer>> start(const PlannerServerOptions& options, const Clock* clock);
  ~PlannerServer();

  // "host:port" with the port actually bound.
  const std::string& boundAddress() const { return boundAddress_; }
  // The web server's "host:port"; empty when it serves none.
  std::string httpAddress() const;
  // A channel to this server that skips the network, whose calls carry a token of `role` made
  // for this process (standalone mode's own daemon: node; loomctl run's client: admin).
  StatusOr<std::shared_ptr<grpc::Channel>> inProcessChannel(security::Role role);
  void shutdown();

 private:
  PlannerServer() = default;

  std::unique_ptr<PlannerCore> core_;
  std::unique_ptr<AccessControl> access_;
  std::unique_ptr<CallGate> gate_;
  std::unique_ptr<PlannerMetrics> metrics_;
  std::unique_ptr<JobServiceImpl> jobService_;
  std::unique_ptr<NodeServiceImpl> nodeService_;
  std::unique_ptr<RolloutRouter> rolloutRouter_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<WebServer> web_;
  std::string boundAddress_;
};

}  // namespace loom::planner
