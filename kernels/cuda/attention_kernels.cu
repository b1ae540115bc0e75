// Rollout's decode attention over the paged KV cache (paged_attention_decode).
//
// One block per (sequence, KV head): it reads that head's keys and values of the sequence once,
// for all the query heads that share them (grouped-query attention), which is what makes decode
// memory-bound on the KV cache rather than on repeated reads. Each warp takes every numWarps-th
// position; its lanes hold dim / 32 elements of the query, key and value rows, so a row is one
// coalesced load. A warp keeps a running softmax (max, sum, weighted values) per query head;
// the warps' partial results are merged through shared memory at the end.
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace loom::kernels::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T, int kDim, int kGroup>
__global__ void __launch_bounds__(kThreads) pagedDecodeKernel(PagedDecodeArgs a) {
  constexpr int kPerLane = kDim / 32;
  const int64_t seq = blockIdx.x;
  const int kvHead = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* q = static_cast<const T*>(a.q);
  const T* keys = static_cast<const T*>(a.keyCache);
  const T* values = static_cast<const T*>(a.valueCache);

  float query[kGroup][kPerLane];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const T* row = q + (seq * a.heads + int64_t(kvHead) * kGroup + g) * kDim + lane * kPerLane;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) query[g][e] = toFloat(row[e]) * a.scale;
  }
  float runMax[kGroup], runSum[kGroup], acc[kGroup][kPerLane];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    runMax[g] = -kInf;
    runSum[g] = 0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[g][e] = 0;
  }

  const int64_t context = a.contextLens[seq];
  const int64_t first = a.window > 0 && context > a.window ? context - a.window : 0;
  const int64_t* table = a.blockTables + seq * a.maxBlocks;
  for (int64_t p = first + warp; p < context; p += kWarps) {
    const int64_t slot = table[p / a.blockSize] * a.blockSize + p % a.blockSize;
    const int64_t offset = (slot * a.kvHeads + kvHead) * kDim + lane * kPerLane;
    float k[kPerLane], v[kPerLane];
    loadChunk<T, kPerLane>(keys + offset, kPerLane, k);
    loadChunk<T, kPerLane>(values + offset, kPerLane, v);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float dot = 0;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) dot += query[g][e] * k[e];
      const float score = warpSum(dot);
      const float nextMax = fmaxf(runMax[g], score);
      const float correction = expf(runMax[g] - nextMax);
      const float weight = expf(score - nextMax);
      runSum[g] = runSum[g] * correction + weight;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[g][e] = acc[g][e] * correction + weight * v[e];
      runMax[g] = nextMax;
    }
  }

  // Merge the warps: each rescales its partial to the common max.
  __shared__ float sharedMax[kWarps][kGroup], sharedSum[kWarps][kGroup];
  __shared__ float sharedAcc[kWarps][kGroup][kDim];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (lane == 0) sharedMax[warp][g] = runMax[g], sharedSum[warp][g] = runSum[g];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) sharedAcc[warp][g][lane * kPerLane + e] = acc[g][e];
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
