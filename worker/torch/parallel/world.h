#pragma once

#include <memory>

#include "backends/comms_logger.h"
#include "backends/communicator.h"
#include "backends/rendezvous/tcp_store.h"
#include "backends/ucx/ucx_transport.h"
#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/rank_context.h"

namespace loom::worker {

// Every rank of the attempt, connected: the attempt's rendezvous store (rank 0 serves it on
// MASTER_PORT) and the world communicator, with the job's comms logger: UCX for host tensors, or
// NCCL for CUDA tensors (each rank on the GPU of its local rank). Members are destroyed
// communicator first, store last.
struct World {
  std::unique_ptr<backends::CommsLogger> logger;
  std::unique_ptr<backends::TcpStore> store;
  std::shared_ptr<backends::UcxTransport> transport;  // host worlds only
  std::shared_ptr<backends::Communicator> comm;
};

enum class TensorHome { kHost, kCuda };
StatusOr<World> connectWorld(const RankContext& context, const planner::JobSpec& spec, TensorHome home);

}  // namespace loom::worker
