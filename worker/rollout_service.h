#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "planner/rollout_spec.h"
#include "worker/rollout/rollout_inbox.h"

namespace grpc {
class Server;
}

namespace loom::worker {

// loom.v1.RolloutService on a served rollout's rank 0, over the engine loop's inbox: requests
// are read and checked here (their sampling over the job's defaults), queued in the inbox, and
// each stream is fed by the loop. The planner routes clients' calls here; this server is not
// meant to be called by them directly. Lives outside libtorch, so it may speak protobuf.
//
// It is built into libloom_rollout_service.so, which only a served rollout's rank 0 loads
// (loadRolloutService): gRPC's libraries cost a process about 4 ms of dynamic linking, which
// every other rank would pay at each launch, eight at a time on a node.
class RolloutServer {
 public:
  // Listens on `host` at a port of the system's choosing.
  static StatusOr<std::unique_ptr<RolloutServer>> start(const std::string& host, rollout::RolloutInbox& inbox,
                                                         const planner::SamplingParams& defaults);
  ~RolloutServer();  // stops serving: calls in flight end UNAVAILABLE

  const std::string& address() const { return address_; }  // "host:port"

 private:
  struct Service;
  RolloutServer() = default;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// A started server as the worker holds it: the handle keeps it serving until dropped.
struct RolloutServing {
  std::shared_ptr<void> server;
  std::string address;  // "host:port"
};
using StartRolloutServiceFn = StatusOr<RolloutServing> (*)(const std::string& host, rollout::RolloutInbox& inbox,
                                                           const planner::SamplingParams& defaults);
// Loads libloom_rollout_service.so once per process: $LOOM_ROLLOUT_SERVICE, else
// ../lib/libloom_rollout_service.so beside the worker binary. The error names the path and
// dlopen's reason.
StatusOr<StartRolloutServiceFn> loadRolloutService();

}  // namespace loom::worker

// Exported by libloom_rollout_service.so: RolloutServer::start, its server behind the handle.
extern "C" loom::worker::StartRolloutServiceFn loom_rollout_service();
