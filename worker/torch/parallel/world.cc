#include "worker/torch/parallel/world.h"

#include <chrono>

#include "backends/ucx/ucx_communicator.h"
#ifdef LOOM_HAVE_NCCL
#include "backends/nccl/nccl_communicator.h"
#endif

namespace loom::worker {

StatusOr<World> connectWorld(const RankContext& ctx, const planner::JobSpec& spec, TensorHome home) {
  World world;
  const auto& logger = spec.deepspeed.commsLogger;
  world.logger = std::make_unique<backends::CommsLogger>(backends::CommsLoggerConfig{
      .enabled = logger.enabled,
      .verbose = logger.verbose,
      .profAll = logger.profAll,
      .profOps = {logger.profOps.begin(), logger.profOps.end()}});
  const auto rendezvous = std::chrono::milliseconds(spec.rendezvousTimeoutMs);
  auto store = backends::TcpStore::connect(
      {.host = ctx.masterAddr, .port = ctx.masterPort, .isServer = ctx.rank == 0, .connectTimeout = rendezvous});
  if (!store.isOk()) return store.status().withContext("rendezvous");
  world.store = std::move(*store);
  if (home == TensorHome::kCuda) {
#ifdef LOOM_HAVE_NCCL
    auto nccl = backends::NcclCommunicator::create({.rank = ctx.rank,
                                                    .worldSize = ctx.worldSize,
                                                    .device = ctx.localRank,
                                                    .store = world.store.get(),
                                                    .rendezvousTimeout = rendezvous,
                                                    .operationTimeout = std::chrono::milliseconds(spec.collectiveTimeoutMs),
                                                    .logger = world.logger.get()});
    if (!nccl.isOk()) return nccl.status();
    world.comm = *nccl;
    return world;
#else
    return failedPrecondition("resources.device: cuda needs the NCCL communicator, which this build does not have "
                              "(built without the CUDA toolkit or NCCL)");
#endif
  }
  auto transport = backends::UcxTransport::create({.rank = ctx.rank,
                                                   .worldSize = ctx.worldSize,
                                                   .store = world.store.get(),
                                                   .rendezvousTimeout = rendezvous,
                                                   .operationTimeout = std::chrono::milliseconds(spec.collectiveTimeoutMs),
                                                   .logger = world.logger.get()});
  if (!transport.isOk()) return transport.status();
  world.transport = *transport;
  world.comm = backends::UcxCommunicator::world(world.transport);
  return world;
}

}  // namespace loom::worker
