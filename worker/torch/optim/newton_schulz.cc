#include "worker/torch/optim/newton_schulz.h"

#include <cmath>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace loom::worker {
namespace {

constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;

bool cpuHasHalfMatmul() {
  // torch.ops.mkldnn._is_mkldnn_fp16_supported, which DeepSpeed's CPU accelerator asks.
  static const bool supported = [] {
    auto op = c10::Dispatcher::singleton().findSchema({"mkldnn::_is_mkldnn_fp16_supported", ""});
    return op.has_value() && op->typed<bool()>().call();
  }();
  return supported;
}

at::Tensor frobeniusNormalized(const at::Tensor& x) {
  return x / (at::linalg_vector_norm(x, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true) + 1e-7);
}

// beta * c + alpha * (a @ b): DeepSpeed's `beta * C + alpha * A @ B` as it writes it (alpha 1:
// `beta * C + A @ B`), or one GEMM with the sum in its epilogue.
at::Tensor productSum(const at::Tensor& c, double beta, const at::Tensor& a, const at::Tensor& b, double alpha,
                      NsKernels kernels) {
  if (kernels == NsKernels::kDeepSpeedOrder)
    return c * beta + at::matmul(alpha == 1.0 ? a : a * alpha, b);
  if (a.dim() == 2) return at::addmm(c, a, b, beta, alpha);
  // Leading dimensions flattened into one batch for baddbmm.
  auto batched = [](const at::Tensor& t) { return t.reshape({-1, t.size(-2), t.size(-1)}); };
  return at::baddbmm(batched(c), batched(a), batched(b), beta, alpha).view(c.sizes());
}

// X <- a X + (b A + c A A) X with A = X X^T, `steps` times.
at::Tensor quinticIterations(at::Tensor x, int steps, NsKernels kernels) {
  for (int i = 0; i < steps; ++i) {
    at::Tensor a = at::matmul(x, x.mT());
    at::Tensor b = productSum(a, kB, a, a, kC, kernels);
    x = productSum(x, kA, b, x, 1.0, kernels);
  }
  return x;
}

double aspectRatioScale(int64_t rows, int64_t cols) {
  return rows > cols ? std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)) : 1.0;
}

}  // namespace

NsKernels newtonSchulzKernels(const at::Device& device) {
  return device.is_cuda() ? NsKernels::kFused : NsKernels::kDeepSpeedOrder;
}

at::ScalarType newtonSchulzDtype(planner::NsMethod method, const at::Device& device) {
  if (method == planner::NsMethod::kGram) {
    // Every GPU CUDA 13 runs on (compute capability 7.5 on) has fp16 matmuls.
    const bool half = device.is_cuda() || cpuHasHalfMatmul();
    return half ? at::kHalf : at::kFloat;
  }
  return at::kBFloat16;  // every CUDA device since Ampere and every CPU here (DeepSpeed's CPU accelerator says so)
}

at::Tensor newtonSchulzStandard(const at::Tensor& g, NsKernels kernels, int steps) {
  const bool tall = g.size(-2) > g.size(-1);
  at::Tensor x = g.to(newtonSchulzDtype(planner::NsMethod::kStandard, g.device()));
  if (tall) x = x.mT();
  x = quinticIterations(frobeniusNormalized(x), steps, kernels);
  return tall ? x.mT() : x;
}

at::Tensor newtonSchulzGram(const at::Tensor& g, NsKernels kernels, int steps) {
  const bool tall = g.size(-2) > g.size(-1);
  // Normalised in a dtype the input cannot have overflowed: fp16 stops at 65504.
  at::Tensor x = g.to(g.scalar_type() == at::kHalf ? at::kFloat : g.scalar_type());
  if (tall) x = x.mT();
  const int64_t n = x.size(-2), m = x.size(-1);
  x = frobeniusNormalized(x).to(newtonSchulzDtype(planner::NsMethod::kGram, g.device()));
  if (m <= n) {  // square: no FLOPs to save
    x = quinticIterations(x, steps, kernels);
    return tall ? x.mT() : x;
  }
  constexpr int kRestartAt = 2;
  at::Tensor r = at::matmul(x, x.mT());
  std::optional<at::Tensor> q;
  for (int i = 0; i < steps; ++i) {
    if (i == kRestartAt) {
      x = at::matmul(*q, x);
      r = at::matmul(x, x.mT());
      q.reset();
    }
    at::Tensor z = productSum(r, kB, r, r, kC, kernels);
    if (!q) {
      q = z.clone();
      q->diagonal(0, -2, -1).add_(kA);
    } else {
      q = productSum(*q, kA, z, *q, 1.0, kernels);
    }
    if (i < steps - 1 && i + 1 != kRestartAt) {
      at::Tensor rz = productSum(r, kA, z, r, 1.0, kernels);
      r = productSum(rz, kA, z, rz, 1.0, kernels);
    }
  }
  return tall ? at::matmul(x.mT(), q->mT()) : at::matmul(*q, x);
}

at::Tensor orthogonalize(const at::Tensor& update, planner::NsMethod method, int64_t headWidth) {
  return orthogonalize(update, method, headWidth, newtonSchulzKernels(update.device()));
}

at::Tensor orthogonalize(const at::Tensor& update, planner::NsMethod method, int64_t headWidth, NsKernels kernels) {
  TORCH_CHECK(update.dim() == 2 || update.dim() == 3, "Muon orthogonalizes matrices, got a tensor of shape ",
              update.sizes());
  auto iterate = [&](const at::Tensor& g) {
    return method == planner::NsMethod::kGram ? newtonSchulzGram(g, kernels) : newtonSchulzStandard(g, kernels);
  };
  const int64_t rows = update.size(-2), cols = update.size(-1);
  if (headWidth > 0) {
    TORCH_CHECK(rows % headWidth == 0, "per-head Muon: ", rows, " rows do not split into heads of ", headWidth);
    std::vector<int64_t> heads = update.sizes().vec();
    heads.back() = headWidth;
    heads.push_back(cols);
    heads[heads.size() - 3] = rows / headWidth;
    at::Tensor perHead = iterate(update.view(heads)) * aspectRatioScale(headWidth, cols);
    return perHead.reshape(update.sizes()).to(update.scalar_type());
  }
  // Out of place: Tensor::mul_(Scalar) rounds the scalar to bf16 first, where DeepSpeed's
  // `update *= scale` multiplies in fp32.
  return (iterate(update) * aspectRatioScale(rows, cols)).to(update.scalar_type());
}

}  // namespace loom::worker
