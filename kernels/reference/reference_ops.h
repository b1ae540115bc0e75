#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

#include "kernels/loom_kernel_abi.h"

namespace loom::kernels::reference {

// The libtorch reference of every kernel op: the oracle of tests/conformance and the
// implementation the registry falls back to when no plugin takes a call. Each is the formula
// the models and torch.optim use, written with ATen ops; backwards come from autograd through
// the forward, so they are not a second derivation to trust. Tensors are CPU and contiguous,
// fp32 or bf16; statistics, losses and optimizer state are fp32. Errors throw c10::Error.

// HF's RMSNorm: h = x * rsqrt(mean(x^2) + eps) in fp32; weight * h.to(x dtype). x [rows, dim].
at::Tensor rmsNormForward(const at::Tensor& x, const at::Tensor& weight, double eps);
// rsqrt(mean(x^2) + eps), fp32 [rows].
at::Tensor rmsNormRstd(const at::Tensor& x, double eps);
// dx (x's dtype) and dweight (fp32 [dim]).
std::pair<at::Tensor, at::Tensor> rmsNormBackward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& dy,
                                                  double eps);

// HF's split-half rotary embedding of q [B, H, S, D] and k [B, Hkv, S, D]; cos and sin [S, D] or
// [B, S, D]. Returns new tensors.
std::pair<at::Tensor, at::Tensor> ropeForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                              const at::Tensor& sin);
// The gradients of q and k given those of the outputs.
std::pair<at::Tensor, at::Tensor> ropeBackward(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& cos,
                                               const at::Tensor& sin);

// silu(gate) * up.
at::Tensor swigluForward(const at::Tensor& gate, const at::Tensor& up);
// dgate, dup.
std::pair<at::Tensor, at::Tensor> swigluBackward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dout);

// softmax(scale * x) over the last dim of x [rows, cols] in fp32, over the entries where `mask`
// (bool or uint8 [rows, cols], undefined: all) is set; masked entries and fully masked rows are 0.
// Returns x's dtype.
at::Tensor maskedSoftmaxForward(const at::Tensor& x, const at::Tensor& mask, double scale);
// dx = scale * y * (dy - sum(dy * y)) in fp32, from the forward's y (what the ABI hands over; the
// conformance tests check it against autograd through maskedSoftmaxForward). Returns y's dtype.
at::Tensor maskedSoftmaxBackward(const at::Tensor& y, const at::Tensor& dy, double scale);

// GPT-OSS's clamped SwiGLU, in the inputs' dtype as the model computes it:
// (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit).
at::Tensor clampedSwigluForward(const at::Tensor& gate, const at::Tensor& up, double alpha, double limit);
// dgate, dup (torch.clamp's gradient rule at the bounds).
std::pair<at::Tensor, at::Tensor> clampedSwigluBackward(const at::Tensor& gate, const at::Tensor& up,
                                                        const at::Tensor& dout, double alpha, double limit);

// Over the vocabulary, logits [rows, vocab], labels int64 [rows]; results fp32 [rows]. Rows go
// through in chunks, so the fp32 copy of at most kVocabChunkBytes of logits exists at once.
constexpr int64_t kVocabChunkBytes = 64 << 20;
struct CrossEntropyRows {
  at::Tensor loss;  // 0 where the label is ignore_index
  at::Tensor lse;   // logsumexp of the row
};
CrossEntropyRows crossEntropyForward(const at::Tensor& logits, const at::Tensor& labels, int64_t ignoreIndex);
// dlogits (logits' dtype) for per-row loss gradients dloss [rows].
at::Tensor crossEntropyBackward(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& dloss,
                                int64_t ignoreIndex);
at::Tensor logprobs(const at::Tensor& logits, const at::Tensor& labels);
at::Tensor entropy(const at::Tensor& logits);
// KL(softmax(p) || softmax(q)) per row.
at::Tensor klDivergence(const at::Tensor& logitsP, const at::Tensor& logitsQ);

// One optimizer step in place, as torch.optim.AdamW / Adam (L2 when not decoupled), Adagrad and
// Lion (lucidrains' formula, DeepSpeed's FusedLion) write it. param and grad fp32 or bf16 (a bf16
// param is updated in fp32 and rounded back); state fp32. amsgrad is refused: it throws
// "amsgrad is not supported".
void adamStep(const loom_adam_config& config, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& expAvg,
              const at::Tensor& expAvgSq);
void lionStep(const loom_lion_config& config, const at::Tensor& param, const at::Tensor& grad,
              const at::Tensor& expAvg);
void adagradStep(const loom_adagrad_config& config, const at::Tensor& param, const at::Tensor& grad,
                 const at::Tensor& sum);

}  // namespace loom::kernels::reference
