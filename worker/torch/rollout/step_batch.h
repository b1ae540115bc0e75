#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/rollout/scheduler.h"
#include "worker/torch/model/paged_kv.h"

namespace loom::worker {

// A scheduled step as the model takes it: the chunks' tokens flat, where each sits in its
// sequence and in the KV cache, and which rows of the logits are drawn from. Single-token chunks
// (decodes) come first, as paged attention wants them.
struct StepBatch {
  at::Tensor tokens;  // [T] int64
  PagedStep paged;
  // For each chunk of the step, in the step's order: its row of the logits, or -1 when it draws
  // nothing (a prompt not yet wholly computed).
  std::vector<int64_t> logitRow;
};

StepBatch makeStepBatch(const rollout::ScheduledStep& step, const rollout::Scheduler& scheduler, at::Device device,
                        int64_t slidingWindow);

}  // namespace loom::worker
