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

at::Tensor ropeKvWriteReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const QkNorms& norms,
                                const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                                const at::Tensor& keyCache, const at::Tensor& valueCache) {
  const int64_t t = q.size(0), d = q.size(2), kvHeads = k.size(1);
  // Each token a batch row of its own with one position, [T, H, 1, D], its angles [T, 1, D].
  at::Tensor q4 = q.unsqueeze(2), k4 = k.unsqueeze(2);
  if (norms.q.defined()) {
    q4 = rmsNormReference(q4, norms.q, norms.eps);
    k4 = rmsNormReference(k4, norms.k, norms.eps);
  }
  auto [qr, kr] = ropeReference(q4, k4, cos.view({t, 1, d}), sin.view({t, 1, d}));
  keyCache.view({-1, kvHeads, d}).index_copy_(0, slots, kr.reshape({t, kvHeads, d}).to(keyCache.scalar_type()));
  valueCache.view({-1, kvHeads, d}).index_copy_(0, slots, v.to(valueCache.scalar_type()));
  return qr.reshape({t, q.size(1), d});
}

std::pair<at::Tensor, at::Tensor> addRmsNormReference(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps) {
  at::Tensor sum = x + residual;
  return {sum, rmsNormReference(sum, weight, eps)};
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

std::pair<at::Tensor, at::Tensor> greedyLogprobsReference(const at::Tensor& logits) {
  at::Tensor tokens = logits.argmax(-1);
  return {tokens, logprobsReference(logits, tokens)};
}

constexpr OpTable kReference{
    .rmsNorm = rmsNormReference,
    .rope = ropeReference,
    .swiglu = swigluReference,
    .clampedSwiglu = kernels::reference::clampedSwigluForward,
    .attention = attentionReference,
    .pagedAttention = pagedAttentionReference,
    .ropeKvWrite = ropeKvWriteReference,
    .addRmsNorm = addRmsNormReference,
    .crossEntropy = crossEntropyReference,
    .logprobs = logprobsReference,
    .greedyLogprobs = greedyLogprobsReference,
};

}  // namespace

const OpTable& referenceOps() { return kReference; }

OpTable& ops() {
  static OpTable table = kReference;
  return table;
}

}  // namespace loom::worker
