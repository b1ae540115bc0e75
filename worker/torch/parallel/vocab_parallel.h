#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"

namespace loom::worker {

// Per-token losses over logits split by vocabulary across the tensor-parallel group `tp`, with
// DeepSpeed 0.19.8's semantics (sequence/vocab_parallel_ops, runtime/chunked_cross_entropy):
// this rank holds logits [N, V / tp] for the columns [vocabStart, vocabStart + V / tp). Only
// per-row statistics cross the group (each row's maximum, its sum of exponentials, its target's
// logit, its entropy or KL terms), never the logits. The arithmetic is fp32 whatever the logits'
// dtype, done `blockRows` rows at a time (0: as many rows as fit 2^24 logits), so no fp32 tensor
// of N x V / tp elements ever exists: forward keeps the logits it was given and a few fp32 values
// per row, backward recomputes the softmax block by block and writes the gradient in the logits'
// dtype. Labels [N] are the same on every rank; -100 marks a row that counts for nothing. Every
// op is differentiable in its logits, and every rank of the group calls it in the same order
// (a group of one rank is a plain, chunked computation). A failed collective throws.

struct VocabShard {
  backends::Communicator* tp = nullptr;  // null: one rank
  int64_t vocabStart = 0;
  int64_t blockRows = 0;
};

// The mean cross-entropy over the rows whose label is not -100 (0 when every row is ignored, as
// DeepSpeed's vocab_parallel_cross_entropy).
at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& labels, const VocabShard& shard);
// log p(label) per row, fp32 [N] (0 where the label is -100).
at::Tensor vocabParallelLogprobs(const at::Tensor& logits, const at::Tensor& labels, const VocabShard& shard);
// The entropy of each row's softmax, fp32 [N].
at::Tensor vocabParallelEntropy(const at::Tensor& logits, const VocabShard& shard);
// Per row, KL(teacher || student) (forward, the default) or KL(student || teacher) (reverse), fp32
// [N]; both logits split alike. Gradients flow to the teacher too unless it is detached.
at::Tensor vocabParallelKl(const at::Tensor& student, const at::Tensor& teacher, bool reverse,
                           const VocabShard& shard);

// DeepSpeed 0.19.8's generalized Jensen-Shannon divergence (runtime/rollout/opsd.py) per row, fp32
// [N]: both logits divided by `temperature`, then with M = (1 - beta) p_student + beta p_teacher,
// beta KL(teacher || M) + (1 - beta) KL(student || M); beta 0 is KL(teacher || student), beta 1
// KL(student || teacher). With clip > 0 each vocabulary entry's term is capped at it before the
// row's sum (pointwise_clip). The gradient flows to the student only: the teacher is a target.
struct JsdOptions {
  double beta = 0.5;
  double temperature = 1.0;
  double pointwiseClip = -1;  // < 0: none
};
at::Tensor vocabParallelGeneralizedJsd(const at::Tensor& student, const at::Tensor& teacher, const JsdOptions& options,
                                       const VocabShard& shard);

}  // namespace loom::worker
