#pragma once

#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/rank_context.h"
#include "worker/report_client.h"

namespace loom::worker {

// A convert job on its rank: the `from` checkpoint (a DeepSpeed ZeRO checkpoint,
// convert/deepspeed_checkpoint.h) streamed into Hugging Face safetensors at `output`. It moves
// bytes only, without libtorch: each tensor is read, cast (convert.dtype) and written in chunks
// of at most 64 MiB, so the rank holds two chunks whatever the model's size. Several ranks split
// the shards (shard s is written by rank s % ranks; the output must be on storage they share).
// The files are written into a temporary directory beside `output`, each fsynced, and rank 0
// renames the directory into place once every shard is there; an `output` that exists and is not
// empty is refused, untouched. Reports tensors_done, bytes_done and progress (of its own shards)
// after each tensor, and memory.peak_rss_bytes.
Status runConvertJob(const RankContext& context, const planner::JobSpec& spec, ReportClient& reports);

}  // namespace loom::worker
