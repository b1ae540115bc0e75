#pragma once

#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/rank_context.h"
#include "worker/torch_runtime.h"

namespace loom::worker {

// A convert job on its rank: the `from` checkpoint (a DeepSpeed ZeRO checkpoint, read by
// worker/convert/) streamed into Hugging Face safetensors at `output`, one tensor at a time, so
// that the rank holds at most one tensor (and the largest shard's header) whatever the model's
// size. The files are written into a temporary directory beside `output`, each fsynced, and the
// directory renamed into place once complete. Reports tensors_done, bytes_done and progress
// after each tensor.
Status runConvertJob(const RankContext& context, const planner::JobSpec& spec,
                     const TorchRuntime::ProgressFn& progress);

}  // namespace loom::worker
