#pragma once

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"

namespace loom::worker {

// Losses over logits split by vocabulary across the tensor-parallel group `tp` (DeepSpeed
// 0.19.8's sequence/vocab_parallel_ops semantics): this rank holds logits [N, V / tp] for the
// columns [vocabStart, vocabStart + V / tp). Only per-row statistics cross the group (the row's
// maximum, then its sum of exponentials with the target's logit), never the logits; everything
// is computed in fp32 whatever the logits' dtype. Labels [N] are the same on every rank; -100
// marks a row that counts for nothing. Both are differentiable in the logits, and every rank of
// the group calls them in the same order.

// The mean cross-entropy over the rows whose label is not -100.
at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& labels, int64_t vocabStart,
                                     backends::Communicator& tp);
// log p(label) per row, fp32 [N] (0 where the label is -100).
at::Tensor vocabParallelLogprobs(const at::Tensor& logits, const at::Tensor& labels, int64_t vocabStart,
                                 backends::Communicator& tp);

}  // namespace loom::worker
