#pragma once

#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

#include "worker/torch/model/paged_attention.h"

namespace loom::worker {

// Per-head RMSNorm weights of q and k (Qwen3's q_norm and k_norm): both undefined where the model
// has none.
struct QkNorms {
  at::Tensor q, k;
  double eps = 0;
};

// The named ops the models call. Every layer goes through this one table, so that a kernel
// plugin can take an op over without the models knowing; the entries start as the libtorch
// reference implementations below, which autograd differentiates.
struct OpTable {
  // HF's RMSNorm: normalise in fp32, scale by `weight` in the input's dtype. x [..., d].
  at::Tensor (*rmsNorm)(const at::Tensor& x, const at::Tensor& weight, double eps);
  // HF's split-half rotary embedding of q [B, H, S, D] and k [B, Hkv, S, D]; cos and sin [S, D],
  // or [B, S, D] when each sample has positions of its own.
  std::pair<at::Tensor, at::Tensor> (*rope)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                            const at::Tensor& sin);
  // silu(gate) * up.
  at::Tensor (*swiglu)(const at::Tensor& gate, const at::Tensor& up);
  // GPT-OSS's clamped SwiGLU (AutoEP's swiglu_oai): g = min(gate, limit), u = clamp(up, -limit,
  // limit), (u + 1) * g * sigmoid(alpha * g); no gradient through a clamped value.
  at::Tensor (*clampedSwiglu)(const at::Tensor& gate, const at::Tensor& up, double alpha, double limit);
  // Attention of q [B, H, S, D] over k and v [B, Hkv, S, D] (grouped-query: H % Hkv == 0):
  // causal, or where `allowed` (bool, broadcastable to [B, H, S, S]) says which keys each query
  // sees (a window, packed documents). Returns [B, H, S, D].
  at::Tensor (*attention)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed);
  // Rollout's attention of a step's tokens q [T, H, D] over the paged KV cache (paged_attention.h).
  at::Tensor (*pagedAttention)(const at::Tensor& q, const at::Tensor& keyCache, const at::Tensor& valueCache,
                               const PagedSequences& sequences);
  // Rollout's q, k and v of a step's T tokens on their way into attention: q [T, H, D], k and v
  // [T, Hkv, D] (views of a fused projection's output do: each head's D contiguous). q and k go
  // through `norms` where defined, then the rotary embedding at cos and sin [T, D]; k and v are
  // written into the caches [blocks, blockSize, Hkv, D] at the flat positions `slots` [T].
  // Returns the rotated q, [T, H, D]. No gradient.
  at::Tensor (*ropeKvWrite)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const QkNorms& norms,
                            const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                            const at::Tensor& keyCache, const at::Tensor& valueCache);
  // The residual stream's add and the RMSNorm after it: sum = x + residual, then {sum,
  // rmsNorm(sum, weight, eps)}; x and residual [..., d] alike.
  std::pair<at::Tensor, at::Tensor> (*addRmsNorm)(const at::Tensor& x, const at::Tensor& residual,
                                                  const at::Tensor& weight, double eps);
  // Mean cross-entropy of logits [N, V] against labels [N] (computed in fp32; label -100 is ignored).
  at::Tensor (*crossEntropy)(const at::Tensor& logits, const at::Tensor& labels);
  // log p(label) per row of logits [N, V], in fp32: [N].
  at::Tensor (*logprobs)(const at::Tensor& logits, const at::Tensor& labels);
  // Greedy decoding over logits [N, V]: {argmax per row (int64, torch.argmax's pick), its log p in
  // fp32}. No gradient.
  std::pair<at::Tensor, at::Tensor> (*greedyLogprobs)(const at::Tensor& logits);
};

// The table in use (the libtorch references unless a plugin replaced an entry).
OpTable& ops();
// The libtorch reference implementations.
const OpTable& referenceOps();

}  // namespace loom::worker
