// Rollout's decode attention over the paged KV cache (paged_attention_decode).
//
// One block per (sequence, KV head): it reads that head's keys and values of the sequence once,
// for all the query heads that share them (grouped-query attention). Decode is bound by reading
// the cache, so the loop keeps many loads in flight: a row of a key (dim elements) is read by a
// group of lanes, 16 bytes each, so one warp covers several positions per iteration, and each
// iteration issues the loads of two. Each lane group keeps a running softmax (max, sum,
// weighted values) per query head; the groups of a warp merge by shuffles, the warps through
// shared memory.
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace loom::kernels::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// A running softmax over some positions: its max score, its sum of exp(score - max), and the
// values weighted alike (this lane's elements of them).
template <int kGroup, int kElems>
struct Running {
  float max[kGroup], sum[kGroup], acc[kGroup][kElems];

  __device__ void reset() {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      max[g] = -kInf;
      sum[g] = 0;
#pragma unroll
      for (int e = 0; e < kElems; ++e) acc[g][e] = 0;
    }
  }
  // Takes in another running softmax of head g (which may have seen nothing: max -inf).
  __device__ void merge(int g, float otherMax, float otherSum, const float (&otherAcc)[kElems]) {
    const float top = fmaxf(max[g], otherMax);
    if (top == -kInf) return;
    const float mine = max[g] == -kInf ? 0.0f : expf(max[g] - top);
    const float theirs = otherMax == -kInf ? 0.0f : expf(otherMax - top);
    sum[g] = sum[g] * mine + otherSum * theirs;
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[g][e] = acc[g][e] * mine + otherAcc[e] * theirs;
    max[g] = top;
  }
};

template <typename T, int kDim, int kGroup>
__global__ void __launch_bounds__(kThreads) pagedDecodeKernel(PagedDecodeArgs a) {
  constexpr int kElems = kVec<T> < kDim ? kVec<T> : kDim;  // elements per lane: one 16-byte load
  constexpr int kLanes = kDim / kElems;                    // lanes per row
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a row's lanes divide the warp");
  constexpr int kRows = 32 / kLanes;                       // positions per warp per load
  constexpr int kStride = kWarps * kRows;                  // positions per block per load
  const int64_t seq = blockIdx.x;
  const int kvHead = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = lane / kLanes, part = lane % kLanes;
  const T* q = static_cast<const T*>(a.q);
  const T* keys = static_cast<const T*>(a.keyCache);
  const T* values = static_cast<const T*>(a.valueCache);

  float query[kGroup][kElems];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    float v[kElems];
    loadChunk<T, kElems>(q + (seq * a.heads + int64_t(kvHead) * kGroup + g) * kDim + part * kElems, kElems, v);
#pragma unroll
    for (int e = 0; e < kElems; ++e) query[g][e] = v[e] * a.scale;
  }
  Running<kGroup, kElems> run;
  run.reset();

  const int64_t context = a.contextLens[seq];
  const int64_t first = a.window > 0 && context > a.window ? context - a.window : 0;
  const int64_t* table = a.blockTables + seq * a.maxBlocks;
  auto load = [&](int64_t p, float (&k)[kElems], float (&v)[kElems]) {
    if (p >= context) return false;
    const int64_t slot = table[p / a.blockSize] * a.blockSize + p % a.blockSize;
    const int64_t offset = (slot * a.kvHeads + kvHead) * kDim + part * kElems;
    loadChunk<T, kElems>(keys + offset, kElems, k);
    loadChunk<T, kElems>(values + offset, kElems, v);
    return true;
  };
  // Every lane runs every iteration (the shuffles need the whole warp); a lane past the end
  // scores nothing.
  auto take = [&](bool valid, const float (&k)[kElems], const float (&v)[kElems]) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float dot = 0;
#pragma unroll
      for (int e = 0; e < kElems; ++e) dot += query[g][e] * k[e];
#pragma unroll
      for (int offset = kLanes / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      if (valid) run.merge(g, dot, 1.0f, v);
    }
  };
  for (int64_t base = first + warp * kRows + row; base - row < context; base += 2 * kStride) {
    float k0[kElems], v0[kElems], k1[kElems], v1[kElems];
    const bool valid0 = load(base, k0, v0);
    const bool valid1 = load(base + kStride, k1, v1);
    take(valid0, k0, v0);
    take(valid1, k1, v1);
  }

  // The row groups of a warp merge by shuffles, lane with lane of the same part of the row.
#pragma unroll
  for (int offset = kLanes; offset < 32; offset <<= 1) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float otherMax = __shfl_xor_sync(0xffffffffu, run.max[g], offset);
      const float otherSum = __shfl_xor_sync(0xffffffffu, run.sum[g], offset);
      float otherAcc[kElems];
#pragma unroll
      for (int e = 0; e < kElems; ++e) otherAcc[e] = __shfl_xor_sync(0xffffffffu, run.acc[g][e], offset);
      run.merge(g, otherMax, otherSum, otherAcc);
    }
  }
  // Then the warps, through shared memory.
  __shared__ float sharedMax[kWarps][kGroup], sharedSum[kWarps][kGroup];
  __shared__ float sharedAcc[kWarps][kGroup][kDim];
  if (row == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (part == 0) sharedMax[warp][g] = run.max[g], sharedSum[warp][g] = run.sum[g];
#pragma unroll
      for (int e = 0; e < kElems; ++e) sharedAcc[warp][g][part * kElems + e] = run.acc[g][e];
    }
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out);
  for (int i = threadIdx.x; i < kGroup * kDim; i += kThreads) {
    const int g = i / kDim, d = i % kDim;
    float max = -kInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max = fmaxf(max, sharedMax[w][g]);
    float sum = 0, value = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      // A warp that saw no position has max -inf and contributes nothing.
      const float scale = sharedMax[w][g] == -kInf ? 0.0f : expf(sharedMax[w][g] - max);
      sum += sharedSum[w][g] * scale;
      value += sharedAcc[w][g][d] * scale;
    }
    out[(seq * a.heads + int64_t(kvHead) * kGroup + g) * kDim + d] = fromFloat<T>(value / sum);
  }
}

template <typename T, int kDim>
cudaError_t launchForDim(const PagedDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  switch (a.heads / a.kvHeads) {
    case 1: pagedDecodeKernel<T, kDim, 1><<<grid, kThreads, 0, stream>>>(a); break;
    case 2: pagedDecodeKernel<T, kDim, 2><<<grid, kThreads, 0, stream>>>(a); break;
    case 4: pagedDecodeKernel<T, kDim, 4><<<grid, kThreads, 0, stream>>>(a); break;
    case 8: pagedDecodeKernel<T, kDim, 8><<<grid, kThreads, 0, stream>>>(a); break;
    default: return cudaErrorInvalidValue;  // pagedDecodeSupported() refused it first
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launchForType(const PagedDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  switch (a.dim) {
    case 32: return launchForDim<T, 32>(a, grid, stream);
    case 64: return launchForDim<T, 64>(a, grid, stream);
    case 128: return launchForDim<T, 128>(a, grid, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool pagedDecodeSupported(int64_t heads, int64_t kvHeads, int64_t dim) {
  if (kvHeads <= 0 || heads % kvHeads != 0) return false;
  const int64_t group = heads / kvHeads;
  return (dim == 32 || dim == 64 || dim == 128) && (group == 1 || group == 2 || group == 4 || group == 8);
}

cudaError_t launchPagedAttentionDecode(const PagedDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.kvHeads));
  return a.dtype == LOOM_DTYPE_BF16 ? launchForType<Bf16>(a, grid, stream) : launchForType<float>(a, grid, stream);
}

}  // namespace loom::kernels::gpu
