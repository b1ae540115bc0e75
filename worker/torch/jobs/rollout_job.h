#pragma once

#include "worker/torch/jobs/job_runner.h"

namespace loom::worker {

// A `rollout` job in batch mode: every prompt of rollout.prompts generated with continuous
// batching over a paged KV cache (worker/torch/rollout/), each request's samples written to
// rollout.output, with throughput and latency in the log and the job's metrics.
StatusOr<std::unique_ptr<JobRunner>> makeRolloutRunner(RankSetup& rank);

}  // namespace loom::worker
