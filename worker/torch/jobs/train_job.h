#pragma once

#include "worker/torch/jobs/job_runner.h"

namespace loom::worker {

// A `train` job on this rank: builds its part of the model from the HF config (and weights, or a
// seeded init) as the Plan lays it out, then runs train.steps optimizer steps with the job's
// DeepSpeed semantics (batch triple, gradient accumulation, gradient averaging over the
// data-parallel group, loss scaling, clipping on the global norm, optimizer, schedule),
// evaluating and checkpointing as the spec says. It resumes from the latest checkpoint when there
// is one. Metrics go to the rank's progress every step; rank 0 prints a line every
// steps_per_print steps.
StatusOr<std::unique_ptr<JobRunner>> makeTrainRunner(RankSetup& rank);

}  // namespace loom::worker
