#include "kernels/reference/reference_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::kernels::reference {
namespace {

at::Tensor rotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// cos / sin [S, D] broadcast over [B, H, S, D] as they are; [B, S, D] gets its head axis.
at::Tensor headBroadcast(const at::Tensor& table) { return table.dim() == 3 ? table.unsqueeze(1) : table; }

at::Tensor ropeOne(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * headBroadcast(cos) + rotateHalf(x) * headBroadcast(sin);
}

// Rows per chunk so that a chunk's fp32 logits stay under kVocabChunkBytes.
int64_t chunkRows(int64_t vocab) {
  return std::max<int64_t>(1, kVocabChunkBytes / (std::max<int64_t>(vocab, 1) * static_cast<int64_t>(sizeof(float))));
}

template <typename Fn>
at::Tensor byRowChunks(const at::Tensor& logits, Fn&& perChunk) {
  const int64_t rows = logits.size(0), step = chunkRows(logits.size(1));
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < rows; r += step) parts.push_back(perChunk(r, std::min(rows, r + step)));
  return parts.empty() ? at::empty({0}, logits.options().dtype(at::kFloat)) : at::cat(parts);
}

// The gradient of each input of fn at `inputs` for output gradient `grad`, by autograd.
template <typename Fn>
std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& inputs, const at::Tensor& grad, Fn&& fn) {
  at::AutoGradMode enable(true);
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  at::Tensor out = fn(leaves);
  out.backward(grad);
  std::vector<at::Tensor> grads;
  for (const auto& leaf : leaves) grads.push_back(leaf.grad());
  return grads;
}

}  // namespace

at::Tensor rmsNormForward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

at::Tensor rmsNormRstd(const at::Tensor& x, double eps) { return at::rsqrt(x.to(at::kFloat).pow(2).mean(-1) + eps); }

std::pair<at::Tensor, at::Tensor> rmsNormBackward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& dy,
                                                  double eps) {
  auto g =
      gradients({x, weight}, dy, [&](const std::vector<at::Tensor>& in) { return rmsNormForward(in[0], in[1], eps); });
  return {g[0], g[1].to(at::kFloat)};
}

std::pair<at::Tensor, at::Tensor> ropeForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                              const at::Tensor& sin) {
  return {ropeOne(q, cos, sin), ropeOne(k, cos, sin)};
}

std::pair<at::Tensor, at::Tensor> ropeBackward(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& cos,
                                               const at::Tensor& sin) {
  auto gq = gradients({at::zeros_like(dq)}, dq, [&](const auto& in) { return ropeOne(in[0], cos, sin); });
  auto gk = gradients({at::zeros_like(dk)}, dk, [&](const auto& in) { return ropeOne(in[0], cos, sin); });
  return {gq[0], gk[0]};
}

at::Tensor swigluForward(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

std::pair<at::Tensor, at::Tensor> swigluBackward(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dout) {
  auto g = gradients({gate, up}, dout, [](const auto& in) { return swigluForward(in[0], in[1]); });
  return {g[0], g[1]};
}

at::Tensor maskedSoftmaxForward(const at::Tensor& x, const at::Tensor& mask, double scale) {
  at::Tensor z = x.to(at::kFloat) * scale;
  if (mask.defined()) z = z.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  // A fully masked row is NaN after softmax (0 / 0): 0 instead, as the ABI says.
  at::Tensor y = at::softmax(z, -1);
  if (mask.defined()) y = at::where(mask.any(-1, /*keepdim=*/true), y, at::zeros_like(y));
  return y.to(x.scalar_type());
}

at::Tensor maskedSoftmaxBackward(const at::Tensor& y, const at::Tensor& dy, double scale) {
  const at::Tensor yf = y.to(at::kFloat), dyf = dy.to(at::kFloat);
  return (yf * (dyf - (dyf * yf).sum(-1, /*keepdim=*/true)) * scale).to(y.scalar_type());
}

at::Tensor clampedSwigluForward(const at::Tensor& gate, const at::Tensor& up, double alpha, double limit) {
  const at::Tensor g = gate.clamp_max(limit);
  const at::Tensor u = up.clamp(-limit, limit);
  return (u + 1) * (g * at::sigmoid(g * alpha));
}

std::pair<at::Tensor, at::Tensor> clampedSwigluBackward(const at::Tensor& gate, const at::Tensor& up,
                                                        const at::Tensor& dout, double alpha, double limit) {
  auto g = gradients({gate, up}, dout,
                     [&](const auto& in) { return clampedSwigluForward(in[0], in[1], alpha, limit); });
  return {g[0], g[1]};
}

CrossEntropyRows crossEntropyForward(const at::Tensor& logits, const at::Tensor& labels, int64_t ignoreIndex) {
  at::NoGradGuard noGrad;
  CrossEntropyRows out;
  out.loss = byRowChunks(logits, [&](int64_t b, int64_t e) {
    return at::cross_entropy_loss(logits.slice(0, b, e).to(at::kFloat), labels.slice(0, b, e), /*weight=*/{},
                                  at::Reduction::None, ignoreIndex);
  });
  out.lse = byRowChunks(logits,
                        [&](int64_t b, int64_t e) { return at::logsumexp(logits.slice(0, b, e).to(at::kFloat), -1); });
  return out;
}

at::Tensor crossEntropyBackward(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& dloss,
                                int64_t ignoreIndex) {
  const int64_t rows = logits.size(0), step = chunkRows(logits.size(1));
  at::Tensor out = at::empty_like(logits);
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t e = std::min(rows, r + step);
    const at::Tensor lab = labels.slice(0, r, e);
    auto g = gradients({logits.slice(0, r, e)}, dloss.slice(0, r, e), [&](const auto& in) {
      return at::cross_entropy_loss(in[0].to(at::kFloat), lab, {}, at::Reduction::None, ignoreIndex);
    });
    out.slice(0, r, e).copy_(g[0]);
  }
  return out;
}

at::Tensor logprobs(const at::Tensor& logits, const at::Tensor& labels) {
  at::NoGradGuard noGrad;
  return byRowChunks(logits, [&](int64_t b, int64_t e) {
    return at::log_softmax(logits.slice(0, b, e).to(at::kFloat), -1)
        .gather(1, labels.slice(0, b, e).unsqueeze(1))
        .squeeze(1);
  });
}

at::Tensor entropy(const at::Tensor& logits) {
  at::NoGradGuard noGrad;
  return byRowChunks(logits, [&](int64_t b, int64_t e) {
    const at::Tensor lp = at::log_softmax(logits.slice(0, b, e).to(at::kFloat), -1);
    return -(lp.exp() * lp).sum(-1);
  });
}

at::Tensor klDivergence(const at::Tensor& logitsP, const at::Tensor& logitsQ) {
  at::NoGradGuard noGrad;
  return byRowChunks(logitsP, [&](int64_t b, int64_t e) {
    const at::Tensor lp = at::log_softmax(logitsP.slice(0, b, e).to(at::kFloat), -1);
    const at::Tensor lq = at::log_softmax(logitsQ.slice(0, b, e).to(at::kFloat), -1);
    return (lp.exp() * (lp - lq)).sum(-1);
  });
}

namespace {

// The fp32 parameter the step updates: the tensor itself, or an fp32 copy written back after.
at::Tensor fp32Param(const at::Tensor& param) {
  return param.scalar_type() == at::kFloat ? param : param.to(at::kFloat);
}
void writeBack(const at::Tensor& param, const at::Tensor& p) {
  if (!p.is_same(param)) param.copy_(p);
}

}  // namespace

void adamStep(const loom_adam_config& c, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& expAvg,
              const at::Tensor& expAvgSq) {
  TORCH_CHECK(!c.amsgrad, "amsgrad is not supported");
  TORCH_CHECK(c.step >= 1, "adam step counts from 1");
  at::NoGradGuard noGrad;
  at::Tensor p = fp32Param(param);
  at::Tensor g = grad.to(at::kFloat);
  if (c.weight_decay != 0) {
    if (c.decoupled_weight_decay) {
      p.mul_(1.0 - c.lr * c.weight_decay);
    } else {
      g = g.add(p, c.weight_decay);
    }
  }
  expAvg.lerp_(g, 1.0 - c.beta1);
  expAvgSq.mul_(c.beta2).addcmul_(g, g, 1.0 - c.beta2);
  const double t = static_cast<double>(c.step);
  const double bc1 = c.bias_correction ? 1.0 - std::pow(c.beta1, t) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(c.beta2, t) : 1.0;
  const at::Tensor denom = (expAvgSq.sqrt() / std::sqrt(bc2)).add_(c.eps);
  p.addcdiv_(expAvg, denom, -(c.lr / bc1));
  writeBack(param, p);
}

void lionStep(const loom_lion_config& c, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& expAvg) {
  at::NoGradGuard noGrad;
  at::Tensor p = fp32Param(param);
  const at::Tensor g = grad.to(at::kFloat);
  const at::Tensor update = (expAvg * c.beta1).add_(g, 1.0 - c.beta1).sign_();
  if (c.weight_decay != 0) p.mul_(1.0 - c.lr * c.weight_decay);
  p.add_(update, -c.lr);
  expAvg.mul_(c.beta2).add_(g, 1.0 - c.beta2);
  writeBack(param, p);
}

void adagradStep(const loom_adagrad_config& c, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& sum) {
  at::NoGradGuard noGrad;
  at::Tensor p = fp32Param(param);
  at::Tensor g = grad.to(at::kFloat);
  if (c.weight_decay != 0) g = g.add(p, c.weight_decay);
  sum.addcmul_(g, g, 1.0);
  const at::Tensor std = sum.sqrt().add_(c.eps);
  p.addcdiv_(g, std, -c.lr);
  writeBack(param, p);
}

}  // namespace loom::kernels::reference
