#include "worker/torch/jobs/response_losses.h"

#include <ATen/ATen.h>

namespace loom::worker {

namespace {

constexpr int64_t kIgnored = -100;

}  // namespace

PolicyGradientTerms policyGradientLoss(const at::Tensor& logprobs, const at::Tensor& oldLogprobs,
                                       const at::Tensor& advantages, const at::Tensor& labels, double clipRatioLow,
                                       double clipRatioHigh) {
  const at::Tensor counted = (labels != kIgnored).to(at::kFloat);
  const at::Tensor old = at::where(oldLogprobs.isnan(), logprobs.detach(), oldLogprobs);
  const at::Tensor ratio = (logprobs - old).exp();
  const at::Tensor unclipped = -advantages * ratio;
  const at::Tensor clipped = -advantages * ratio.clamp(1.0 - clipRatioLow, 1.0 + clipRatioHigh);
  PolicyGradientTerms out;
  out.lossSum = (at::maximum(unclipped, clipped) * counted).sum();
  out.clippedTokens = ((clipped > unclipped).to(at::kFloat) * counted).sum().detach();
  out.ratioSum = (ratio.detach() * counted).sum();
  return out;
}

at::Tensor jsdLossSum(const at::Tensor& student, const at::Tensor& teacher, const at::Tensor& labels,
                      const JsdOptions& options, int64_t teacherTopK, const VocabShard& shard) {
  const at::Tensor counted = (labels != kIgnored).to(at::kFloat);
  if (teacherTopK <= 0) return (vocabParallelGeneralizedJsd(student, teacher, options, shard) * counted).sum();
  // The teacher's top-k entries of each row; the divergence over them alone, renormalized.
  const at::Tensor top = std::get<1>(teacher.topk(teacherTopK, /*dim=*/1));
  const VocabShard whole{.tp = nullptr, .vocabStart = 0, .blockRows = shard.blockRows};
  return (vocabParallelGeneralizedJsd(student.gather(1, top), teacher.gather(1, top), options, whole) * counted).sum();
}

}  // namespace loom::worker
