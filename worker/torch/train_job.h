#pragma once

#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/rank_context.h"
#include "worker/torch_runtime.h"

namespace loom::worker {

// A `train` job on this rank: builds the model from its HF config (and weights, or a seeded
// init), then runs train.steps optimizer steps with the job's DeepSpeed semantics (batch
// triple, gradient accumulation, gradient all-reduce over the data-parallel ranks, loss
// scaling, clipping, optimizer, schedule), evaluating and checkpointing as the spec says. It
// resumes from the latest checkpoint when there is one. Metrics go to `progress` every step;
// rank 0 prints a line every steps_per_print steps.
Status runTrain(const RankContext& context, const planner::JobSpec& spec, const TorchRuntime::ProgressFn& progress);

// An `eval` job: the mean loss over data.eval (or its first eval.max_batches micro-batches per
// rank), and the per-token logprobs in eval.logprobs_output when asked.
Status runEval(const RankContext& context, const planner::JobSpec& spec, const TorchRuntime::ProgressFn& progress);

}  // namespace loom::worker
