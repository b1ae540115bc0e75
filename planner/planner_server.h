#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/clock.h"
#include "common/status.h"
#include "planner/planner_core.h"

namespace loom::planner {

class JobServiceImpl;
class NodeServiceImpl;
class RolloutRouter;

struct PlannerServerOptions {
  std::string listenAddress = "127.0.0.1:7450";  // port 0 picks a free one; see boundAddress()
  PlannerOptions planner;
};

// The planner service: the core plus its gRPC server (JobService, NodeService, RolloutService
// relayed to served rollouts (rollout_router.h), grpc.health.v1
// and server reflection). Used by loom-planner and, in process, by `loomd --standalone`.
class PlannerServer {
 public:
  static StatusOr<std::unique_ptr<PlannerServer>> start(const PlannerServerOptions& options, const Clock* clock);
  ~PlannerServer();

  // "host:port" with the port actually bound.
  const std::string& boundAddress() const { return boundAddress_; }
  // A channel to this server that skips the network (standalone mode's own daemon uses it).
  std::shared_ptr<grpc::Channel> inProcessChannel();
  void shutdown();

 private:
  PlannerServer() = default;

  std::unique_ptr<PlannerCore> core_;
  std::unique_ptr<JobServiceImpl> jobService_;
  std::unique_ptr<NodeServiceImpl> nodeService_;
  std::unique_ptr<RolloutRouter> rolloutRouter_;
  std::unique_ptr<grpc::Server> server_;
  std::string boundAddress_;
};

}  // namespace loom::planner
