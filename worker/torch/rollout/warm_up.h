#pragma once

#include <cstdint>

#include "worker/rollout/scheduler.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/rollout/decode_graphs.h"

namespace loom::worker {

// What the rollout's first steps would otherwise pay for, paid before the first request (as
// vLLM's engine does at start): one step of max_num_batched_tokens tokens shaped like the
// busiest steps (decodes beside prompt chunks) through the model and the sampler, which loads
// their kernels and grows the allocator's pools to that step's size, then every decode graph,
// largest first so that the smaller ones reuse its memory. Its keys and values go to the scratch
// block no sequence holds. On a GPU only (a CPU has no lazy loading to pay for), and on one rank:
// under tensor parallelism the other ranks compute only the steps rank 0 sends them.
// Returns the number of graphs captured.
int64_t warmUpRollout(DecoderModel& model, PagedKvCache& cache, const rollout::SchedulerLimits& limits,
                      int64_t scratchBlock, DecodeGraphs* graphs);

}  // namespace loom::worker
