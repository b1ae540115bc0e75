#pragma once

#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/rank_context.h"
#include "worker/torch_runtime.h"

namespace loom::worker {

// Connects the ranks of the attempt (rank 0 serves the rendezvous store on MASTER_PORT), then,
// like nccl-tests, runs each op of `probe.collectives` at every size from min_bytes to
// max_bytes (doubling): warm-up, a verified run, timed iterations. The slowest rank's mean time
// gives algbw and busbw; they are reported as metrics, and rank 0 prints a table to its log,
// followed by the comms logger's summary when deepspeed.comms_logger is enabled.
Status runCollectiveProbe(const RankContext& context, const planner::JobSpec& spec,
                          const TorchRuntime::ProgressFn& progress);

}  // namespace loom::worker
