#pragma once

// Device helpers shared by the CUDA plugin's kernels: element conversion, chunked loads and
// stores (16 bytes where the address allows), block reductions, and the loop over one row that
// the row kernels (rms_norm, the vocabulary ops) share.
//
// Rounding follows the libtorch reference the way the CPU plugin does: fp32 math, bf16
// intermediates rounded where HF's modules round them. Where the reference runs two tensor ops
// (a product, then a sum) the kernels use __fmul_rn / __fadd_rn, which nvcc never contracts into
// an FMA, so each step rounds as the reference's does.

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/loom_kernel_abi.h"

namespace loom::kernels::gpu {

using Bf16 = __nv_bfloat16;

constexpr float kInf = __builtin_huge_valf();

__device__ __forceinline__ float toFloat(float v) { return v; }
__device__ __forceinline__ float toFloat(Bf16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v) {
  return v;
}
// Round to nearest even, as c10::BFloat16 does.
template <>
__device__ __forceinline__ Bf16 fromFloat<Bf16>(float v) {
  return __float2bfloat16_rn(v);
}

// v as a T holds it, back in fp32: the intermediate roundings of a bf16 model.
template <typename T>
__device__ __forceinline__ float roundTo(float v) {
  return toFloat(fromFloat<T>(v));
}

// Elements per 16-byte access.
template <typename T>
constexpr int kVec = 16 / sizeof(T);

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void loadChunk(const T* __restrict__ p, int count, float (&v)[N]) {
  if (count == N && reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T, N>) == 0) {
    const Pack<T, N> pk = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = toFloat(pk.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = k < count ? toFloat(p[k]) : 0.0f;
  }
}

template <typename T, int N>
__device__ __forceinline__ void storeChunk(T* __restrict__ p, int count, const float (&v)[N]) {
  if (count == N && reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T, N>) == 0) {
    Pack<T, N> pk;
#pragma unroll
    for (int k = 0; k < N; ++k) pk.v[k] = fromFloat<T>(v[k]);
    *reinterpret_cast<Pack<T, N>*>(p) = pk;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (k < count) p[k] = fromFloat<T>(v[k]);
  }
}

// Calls f(i, count) for the chunks [i, i + count) of a row of n elements starting at `row`, each
// chunk on one thread of the block: an unaligned head (thread 0), then chunks of kVec<T>
// elements aligned to 16 bytes relative to `row`, then the tail (the last thread). Other arrays
// read alongside at the same offsets take vector loads where their own alignment allows.
template <typename T, typename F>
__device__ __forceinline__ void forEachChunk(const T* row, int64_t n, F&& f) {
  constexpr int V = kVec<T>;
  const int misaligned = static_cast<int>((reinterpret_cast<uintptr_t>(row) % 16) / sizeof(T));
  const int64_t head = misaligned ? (V - misaligned < n ? V - misaligned : n) : 0;
  if (head > 0 && threadIdx.x == 0) f(int64_t{0}, static_cast<int>(head));
  const int64_t chunks = (n - head) / V;
  // Unrolled so that a thread's loads of several chunks are in flight together.
#pragma unroll 4
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) f(head + c * V, V);
  const int64_t tail = head + chunks * V;
  if (tail < n && threadIdx.x == blockDim.x - 1) f(tail, static_cast<int>(n - tail));
}

// A warp shuffle of a struct of floats (the reduction states), field by field.
template <typename S>
__device__ __forceinline__ S shuffleXor(const S& v, int offset) {
  static_assert(sizeof(S) % sizeof(float) == 0, "a reduction state is made of floats");
  constexpr int kFields = sizeof(S) / sizeof(float);
  float in[kFields], out[kFields];
  memcpy(in, &v, sizeof(S));
#pragma unroll
  for (int k = 0; k < kFields; ++k) out[k] = __shfl_xor_sync(0xffffffffu, in[k], offset);
  S r;
  memcpy(&r, out, sizeof(S));
  return r;
}

template <typename S, typename Combine>
__device__ __forceinline__ S warpReduce(S v, Combine combine) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = combine(v, shuffleXor(v, offset));
  return v;
}

// Reduces v over the block (blockDim.x a multiple of 32); every thread gets the result. The
// order of the combines depends only on blockDim, so results are deterministic. combine(x,
// identity) must be x. Contains barriers: every thread of the block must call it.
template <typename S, typename Combine>
__device__ __forceinline__ S blockReduce(S v, S identity, Combine combine) {
  __shared__ S partials[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warpReduce(v, combine);
  if (lane == 0) partials[warp] = v;
  __syncthreads();
  // Every warp reduces the partials itself: the result reaches all threads without a broadcast.
  S r = lane < static_cast<int>(blockDim.x / 32) ? partials[lane] : identity;
  r = warpReduce(r, combine);
  __syncthreads();  // partials is reused by the next call
  return r;
}

__device__ __forceinline__ float blockSum(float v) {
  return blockReduce(v, 0.0f, [](float a, float b) { return a + b; });
}

// Threads per block for a row of `chunks` chunks: a whole number of warps, at most `cap`.
inline int rowThreads(int64_t chunks, int cap) {
  int64_t t = (chunks + 31) / 32 * 32;
  if (t < 32) t = 32;
  return static_cast<int>(t < cap ? t : cap);
}

template <typename F>
inline void byDtype(loom_dtype dtype, F&& f) {
  if (dtype == LOOM_DTYPE_BF16) {
    f(Bf16{});
  } else {
    f(float{});
  }
}

}  // namespace loom::kernels::gpu
