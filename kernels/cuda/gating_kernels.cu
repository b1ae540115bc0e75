// GPT-OSS's clamped SwiGLU and the masked softmax (kernels/loom_kernel_abi.h has their
// definitions). fp32 math; the clamped SwiGLU rounds its intermediates to T where the libtorch
// reference, computing in T, does.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace loom::kernels::gpu {
namespace {

constexpr int kElementThreads = 256;

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

template <typename T>
__global__ void clampedSwigluKernel(SwigluArgs a, float alpha, float limit, bool backward) {
  constexpr int V = kVec<T>;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= a.n) return;
  const int count = a.n - i < V ? static_cast<int>(a.n - i) : V;
  float gate[V], up[V];
  loadChunk(static_cast<const T*>(a.gate) + i, count, gate);
  loadChunk(static_cast<const T*>(a.up) + i, count, up);
  if (!backward) {
    float out[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float g = fminf(gate[k], limit), u = fminf(fmaxf(up[k], -limit), limit);
      const float glu = roundTo<T>(g * roundTo<T>(sigmoid(roundTo<T>(g * alpha))));
      out[k] = roundTo<T>(u + 1.0f) * glu;
    }
    storeChunk(static_cast<T*>(a.out) + i, count, out);
    return;
  }
  float dout[V], dgate[V], dup[V];
  loadChunk(static_cast<const T*>(a.dout) + i, count, dout);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float g = fminf(gate[k], limit), u = fminf(fmaxf(up[k], -limit), limit);
    const float s = sigmoid(g * alpha);
    // torch.clamp's rule: a gradient where the input lies within the bounds, ends included.
    dgate[k] = gate[k] <= limit ? dout[k] * (u + 1.0f) * (s + alpha * g * s * (1.0f - s)) : 0.0f;
    dup[k] = up[k] >= -limit && up[k] <= limit ? dout[k] * g * s : 0.0f;
  }
  storeChunk(static_cast<T*>(a.dgate) + i, count, dgate);
  storeChunk(static_cast<T*>(a.dup) + i, count, dup);
}

template <typename T>
__global__ void maskedSoftmaxForwardKernel(MaskedSoftmaxArgs a) {
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * a.cols;
  const uint8_t* mask = a.mask ? a.mask + row * a.cols : nullptr;
  T* y = static_cast<T*>(a.out) + row * a.cols;
  float m = -kInf;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x)
    if (!mask || mask[c]) m = fmaxf(m, toFloat(x[c]) * a.scale);
  m = blockReduce(m, -kInf, [](float p, float q) { return fmaxf(p, q); });
  if (m == -kInf) {  // nothing left in the row (every thread sees the same m)
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) y[c] = fromFloat<T>(0.0f);
    return;
  }
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x)
    if (!mask || mask[c]) s += expf(toFloat(x[c]) * a.scale - m);
  const float inv = 1.0f / blockSum(s);
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x)
    y[c] = fromFloat<T>(!mask || mask[c] ? expf(toFloat(x[c]) * a.scale - m) * inv : 0.0f);
}

template <typename T>
__global__ void maskedSoftmaxBackwardKernel(MaskedSoftmaxArgs a) {
  const int64_t row = blockIdx.x;
  const T* y = static_cast<const T*>(a.y) + row * a.cols;
  const T* dy = static_cast<const T*>(a.dy) + row * a.cols;
  T* dx = static_cast<T*>(a.out) + row * a.cols;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) dot += toFloat(dy[c]) * toFloat(y[c]);
  dot = blockSum(dot);
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x)
    dx[c] = fromFloat<T>(a.scale * toFloat(y[c]) * (toFloat(dy[c]) - dot));
}

}  // namespace

cudaError_t launchClampedSwiglu(const ClampedSwigluArgs& a, cudaStream_t stream) {
  byDtype(a.tensors.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t chunks = (a.tensors.n + kVec<T> - 1) / kVec<T>;
    const auto blocks = static_cast<unsigned>((chunks + kElementThreads - 1) / kElementThreads);
    clampedSwigluKernel<T><<<blocks, kElementThreads, 0, stream>>>(a.tensors, a.alpha, a.limit, a.backward);
  });
  return cudaGetLastError();
}

cudaError_t launchMaskedSoftmax(const MaskedSoftmaxArgs& a, cudaStream_t stream) {
  const int threads = rowThreads(a.cols, 1024);
  const auto blocks = static_cast<unsigned>(a.rows);
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (a.backward) {
      maskedSoftmaxBackwardKernel<T><<<blocks, threads, 0, stream>>>(a);
    } else {
      maskedSoftmaxForwardKernel<T><<<blocks, threads, 0, stream>>>(a);
    }
  });
  return cudaGetLastError();
}

}  // namespace loom::kernels::gpu
