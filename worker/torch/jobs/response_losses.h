#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "worker/torch/parallel/vocab_parallel.h"

namespace loom::worker {

// The losses of training on rollout data (planner/post_training_spec.h), as sums over the rows
// whose label is not -100 (the response tokens), which the trainer divides by the step's count of
// them over every rank: DeepSpeed's unreduced sums for distributed aggregation (opsd.py).

// PPO's clipped surrogate per response token, summed. logprobs [N] fp32: the model's log p(label),
// differentiable; oldLogprobs [N]: the behaviour policy's (NaN where none is stored: the ratio is
// 1 with logp's gradient, REINFORCE's); advantages [N]; labels [N].
struct PolicyGradientTerms {
  at::Tensor lossSum;        // differentiable
  at::Tensor clippedTokens;  // tokens whose clipped term was the larger (PPO's clipfrac, summed)
  at::Tensor ratioSum;       // the importance ratios, summed
};
PolicyGradientTerms policyGradientLoss(const at::Tensor& logprobs, const at::Tensor& oldLogprobs,
                                       const at::Tensor& advantages, const at::Tensor& labels, double clipRatioLow,
                                       double clipRatioHigh);

// The generalized JSD (vocabParallelGeneralizedJsd) between student and teacher logits [N, V / tp],
// summed over the rows that count. With teacherTopK > 0 both are first restricted to the teacher's
// top-k entries of each row (DeepSpeed's teacher_top_k), on one rank only.
at::Tensor jsdLossSum(const at::Tensor& student, const at::Tensor& teacher, const at::Tensor& labels,
                      const JsdOptions& options, int64_t teacherTopK, const VocabShard& shard);

}  // namespace loom::worker
