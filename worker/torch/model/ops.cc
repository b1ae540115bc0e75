#include "worker/torch/model/ops.h"

#include <cmath>

#include <ATen/ATen.h>

#include "kernels/reference/reference_ops.h"

namespace loom::worker {
namespace {

at::Tensor rmsNormReference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

at::Tensor rotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

std::pair<at::Tensor, at::Tensor> ropeReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cosIn,
                                                const at::Tensor& sinIn) {
  // Per-sample angles [B, S, D] broadcast over the heads.
  const at::Tensor cos = cosIn.dim() == 3 ? cosIn.unsqueeze(1) : cosIn;
  const at::Tensor sin = sinIn.dim() == 3 ? sinIn.unsqueeze(1) : sinIn;
  return {q * cos + rotateHalf(q) * sin, k * cos + rotateHalf(k) * sin};
}

at::Tensor swigluReference(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor attentionReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& allowed) {
  // Grouped-query attention without copying K and V per query head (enable_gqa).
  const bool gqa = q.size(1) != k.size(1);
  const std::optional<at::Tensor> mask = allowed.defined() ? std::optional<at::Tensor>(allowed) : std::nullopt;
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/!mask, /*scale=*/std::nullopt,
                                          gqa);
}

at::Tensor crossEntropyReference(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits.to(at::kFloat), labels, /*weight=*/{}, at::Reduction::Mean,
                                /*ignore_index=*/-100);
}

at::Tensor logprobsReference(const at::Tensor& logits, const at::Tensor& labels) {
  return at::log_softmax(logits.to(at::kFloat), -1).gather(1, labels.unsqueeze(1)).squeeze(1);
}

constexpr OpTable kReference{
    .rmsNorm = rmsNormReference,
    .rope = ropeReference,
    .swiglu = swigluReference,
    .clampedSwiglu = kernels::reference::clampedSwigluForward,
    .attention = attentionReference,
    .pagedAttention = pagedAttentionReference,
    .crossEntropy = crossEntropyReference,
    .logprobs = logprobsReference,
};

}  // namespace

const OpTable& referenceOps() { return kReference; }

OpTable& ops() {
  static OpTable table = kReference;
  return table;
}

}  // namespace loom::worker
