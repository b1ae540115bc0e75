#pragma once

#include "worker/torch/jobs/job_runner.h"

namespace loom::worker {

// An `eval` job: the mean loss over data.eval (or its first eval.max_batches micro-batches per
// data-parallel rank), and the per-token logprobs in eval.logprobs_output when asked, at any
// tensor-parallel layout (vocabulary-parallel logprobs, never gathered logits).
StatusOr<std::unique_ptr<JobRunner>> makeEvalRunner(RankSetup& rank);

}  // namespace loom::worker
