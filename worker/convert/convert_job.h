#pragma once

#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/rank_context.h"
#include "worker/report_client.h"

namespace loom::worker {

// A convert job on its rank, without libtorch: it moves bytes. The `from` checkpoint (DeepSpeed
// ZeRO, convert/deepspeed_checkpoint.h, or Loom, convert/loom_checkpoint.h) becomes
// - to: hf    Hugging Face safetensors (to_hf.h): each tensor read, cast (convert.dtype) and
//             written in chunks of at most 64 MiB, so the rank holds two chunks whatever the
//             model's size; several ranks split the shards;
// - to: loom  a Loom checkpoint for convert.layout (to_loom.h), optimizer state included, each
//             piece copied once from where the source keeps it; several ranks split the files.
// Written into a temporary directory beside `output` and renamed into place when whole
// (output_dir.h); an `output` that exists and is not empty is refused, untouched. Reports
// tensors_done, bytes_done and progress (of its own share) and memory.peak_rss_bytes.
Status runConvertJob(const RankContext& context, const planner::JobSpec& spec, ReportClient& reports);

}  // namespace loom::worker
