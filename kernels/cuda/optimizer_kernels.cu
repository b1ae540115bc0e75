// The CUDA plugin's optimizer steps: AdamW / Adam, Lion and Adagrad, fused into one pass over
// param, grad and the fp32 state. fp32 math whatever the dtypes; each operation rounds as
// torch.optim's tensor op of the same step does on the CPU, in the CPU plugin's order
// (kernels/cpu/kernels_impl.h): FMAs where ATen's lerp and add-with-alpha use them, separate
// products and sums (__fmul_rn / __fadd_rn, never contracted) elsewhere.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace loom::kernels::gpu {
namespace {

constexpr int kThreads = 256;
// Elements per thread: 16 bytes of each fp32 stream (8 of a bf16 one).
constexpr int kV = 4;

template <typename P, typename G>
__global__ void adamKernel(AdamArgs a) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (i >= a.t.n) return;
  const int count = a.t.n - i < kV ? static_cast<int>(a.t.n - i) : kV;
  P* param = static_cast<P*>(a.t.param) + i;
  const G* grad = static_cast<const G*>(a.t.grad) + i;
  float* m = a.t.first + i;
  float* v = a.t.second + i;
  float p[kV], g[kV], m0[kV], v0[kV];
  loadChunk(param, count, p);
  loadChunk(grad, count, g);
  loadChunk(m, count, m0);
  loadChunk(v, count, v0);
  const bool lerpLow = a.lerpWeight < 0.5f;
  const float w = lerpLow ? a.lerpWeight : a.lerpWeight - 1.0f;
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    if (a.hasWeightDecay) {
      if (a.decoupled) {
        p[k] = __fmul_rn(p[k], a.decay);  // param.mul_(1 - lr * wd)
      } else {
        g[k] = fmaf(p[k], a.weightDecay, g[k]);  // grad.add(param, alpha=wd)
      }
    }
    // exp_avg.lerp_(grad, 1 - beta1), as ATen's lerp computes it
    const float m1 = fmaf(w, __fsub_rn(g[k], m0[k]), lerpLow ? m0[k] : g[k]);
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    const float v1 = __fadd_rn(__fmul_rn(v0[k], a.beta2), __fmul_rn(__fmul_rn(a.oneMinusBeta2, g[k]), g[k]));
    // denom = exp_avg_sq.sqrt() / sqrt(bc2) + eps (by the reciprocal, as the CPU plugin);
    // param.addcdiv_(exp_avg, denom, value=-lr / bc1)
    const float denom = fmaf(sqrtf(v1), a.invBc2Sqrt, a.eps);
    p[k] = __fadd_rn(p[k], __fdiv_rn(__fmul_rn(a.negStepSize, m1), denom));
    m0[k] = m1;
    v0[k] = v1;
  }
  storeChunk(param, count, p);
  storeChunk(m, count, m0);
  storeChunk(v, count, v0);
}

__device__ __forceinline__ float sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }

template <typename P, typename G>
__global__ void lionKernel(LionArgs a) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (i >= a.t.n) return;
  const int count = a.t.n - i < kV ? static_cast<int>(a.t.n - i) : kV;
  P* param = static_cast<P*>(a.t.param) + i;
  const G* grad = static_cast<const G*>(a.t.grad) + i;
  float* m = a.t.first + i;
  float p[kV], g[kV], m0[kV];
  loadChunk(param, count, p);
  loadChunk(grad, count, g);
  loadChunk(m, count, m0);
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    const float update = sign(fmaf(g[k], a.oneMinusBeta1, __fmul_rn(m0[k], a.beta1)));
    if (a.hasWeightDecay) p[k] = __fmul_rn(p[k], a.decay);
    p[k] = fmaf(update, a.negLr, p[k]);
    m0[k] = fmaf(g[k], a.oneMinusBeta2, __fmul_rn(m0[k], a.beta2));
  }
  storeChunk(param, count, p);
  storeChunk(m, count, m0);
}

template <typename P, typename G>
__global__ void adagradKernel(AdagradArgs a) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (i >= a.t.n) return;
  const int count = a.t.n - i < kV ? static_cast<int>(a.t.n - i) : kV;
  P* param = static_cast<P*>(a.t.param) + i;
  const G* grad = static_cast<const G*>(a.t.grad) + i;
  float* sum = a.t.first + i;
  float p[kV], g[kV], s[kV];
  loadChunk(param, count, p);
  loadChunk(grad, count, g);
  loadChunk(sum, count, s);
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    if (a.hasWeightDecay) g[k] = fmaf(p[k], a.weightDecay, g[k]);       // grad.add(param, alpha=wd)
    s[k] = __fadd_rn(s[k], __fmul_rn(g[k], g[k]));                        // state_sum.addcmul_(grad, grad)
    const float denom = __fadd_rn(sqrtf(s[k]), a.eps);                    // state_sum.sqrt().add_(eps)
    p[k] = __fadd_rn(p[k], __fdiv_rn(__fmul_rn(a.negLr, g[k]), denom));  // param.addcdiv_(grad, std, -lr)
  }
  storeChunk(param, count, p);
  storeChunk(sum, count, s);
}

template <typename F>
void byParamAndGrad(const OptimizerTensors& t, F&& f) {
  byDtype(t.paramDtype, [&](auto p) { byDtype(t.gradDtype, [&](auto g) { f(p, g); }); });
}

unsigned blocksFor(int64_t n) { return static_cast<unsigned>(((n + kV - 1) / kV + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t launchAdam(const AdamArgs& a, cudaStream_t stream) {
  byParamAndGrad(a.t, [&](auto p, auto g) {
    adamKernel<decltype(p), decltype(g)><<<blocksFor(a.t.n), kThreads, 0, stream>>>(a);
  });
  return cudaGetLastError();
}

cudaError_t launchLion(const LionArgs& a, cudaStream_t stream) {
  byParamAndGrad(a.t, [&](auto p, auto g) {
    lionKernel<decltype(p), decltype(g)><<<blocksFor(a.t.n), kThreads, 0, stream>>>(a);
  });
  return cudaGetLastError();
}

cudaError_t launchAdagrad(const AdagradArgs& a, cudaStream_t stream) {
  byParamAndGrad(a.t, [&](auto p, auto g) {
    adagradKernel<decltype(p), decltype(g)><<<blocksFor(a.t.n), kThreads, 0, stream>>>(a);
  });
  return cudaGetLastError();
}

}  // namespace loom::kernels::gpu
