// Rollout's decode attention over the paged KV cache (paged_attention_decode).
//
// One block per (sequence, KV head): it reads that head's keys and values of the sequence once,
// for all the query heads that share them (grouped-query attention). Decode is bound by reading
// the cache, so the reads never wait on the arithmetic and the arithmetic is kept small:
// - ChunkPipeline copies the keys and values of the next chunks of positions into shared memory
//   with cp.async while the block scores the current one, and looks up the block table's slots
//   one chunk ahead of the copies;
// - in bf16 with head_dim 64 or 128, the tensor cores score and weigh a chunk (mmaDecodeKernel):
//   the query heads are the rows of an m16n8k16 MMA, each warp takes 16 of the chunk's positions;
// - otherwise (fp32, head_dim 32) lanes do it (lanesDecodeKernel): a row of a key is scored by a
//   group of lanes, 16 bytes each, whose partial dot products meet by shuffles.
// Either way each warp keeps a running softmax (max, sum, weighted values) per query head,
// rescaled once per chunk, and the warps merge through shared memory at the end.
#include <cuda_runtime_api.h>

#include <type_traits>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/paged_chunks.cuh"

namespace loom::kernels::gpu {
namespace {

using namespace paged;

// ---- lanes: fp32, and head_dim 32 ----

template <typename T, int kDim, int kGroup, int kStages>
__global__ void __launch_bounds__(kThreads) lanesDecodeKernel(PagedDecodeArgs a) {
  constexpr int kElems = 16 / sizeof(T);                             // elements per lane
  constexpr int kLanes = kDim / kElems;                              // lanes per row
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a row's lanes divide the warp");
  constexpr int kRows = 32 / kLanes;                                 // positions per warp per read
  constexpr int kStride = kWarps * kRows;                            // positions per block per read
  constexpr int kChunk = 8192 / (kDim * int(sizeof(T)));            // 8 KiB of keys
  constexpr int kTile = kChunk / kStride;                            // reads per lane per chunk
  static_assert(kTile >= 1 && kChunk % kStride == 0, "a chunk is whole reads");
  using Pipeline = ChunkPipeline<T, kDim, kChunk, kStages>;
  using Partials = WarpPartials<kGroup, kDim>;
  __shared__ __align__(16) unsigned char shared[maxOf<Pipeline::kBytes, Partials::kBytes>];

  const int64_t seq = blockIdx.x;
  const int kvHead = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = lane / kLanes, part = lane % kLanes;
  Pipeline pipeline(a, shared, seq, kvHead);

  float query[kGroup][kElems];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    float v[kElems];
    loadChunk<T, kElems>(static_cast<const T*>(a.q) + (seq * a.heads + int64_t(kvHead) * kGroup + g) * kDim +
                             part * kElems, kElems, v);
#pragma unroll
    for (int e = 0; e < kElems; ++e) query[g][e] = v[e] * (a.scale * kLog2e);
  }
  // This lane's running softmax: per query head, the max score, the sum of exp(score - max) and
  // its elements of the values weighted alike.
  float max[kGroup], sum[kGroup], acc[kGroup][kElems];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    max[g] = -kInf;
    sum[g] = 0;
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[g][e] = 0;
  }

  for (int c = 0; c < pipeline.chunks; ++c) {
    pipeline.advance(c);
    const int chunkFirst = pipeline.first + c * kChunk;
    float score[kGroup][kTile];
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      const int position = warp * kRows + row + t * kStride;  // in the chunk
      const auto k = pipeline.keysOf(c)[Pipeline::index(position, part)];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0;
#pragma unroll
        for (int e = 0; e < kElems; ++e) dot = fmaf(query[g][e], toFloat(k.v[e]), dot);
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        score[g][t] = chunkFirst + position < pipeline.context ? dot : -kInf;
      }
    }
    // One rescale per chunk: the new max covers the chunk's scores.
    float top[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      top[g] = max[g];
#pragma unroll
      for (int t = 0; t < kTile; ++t) top[g] = fmaxf(top[g], score[g][t]);
      const float rescale = weightOf(max[g], top[g]);
      sum[g] *= rescale;
#pragma unroll
      for (int e = 0; e < kElems; ++e) acc[g][e] *= rescale;
      max[g] = top[g];
    }
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      const auto v = pipeline.valuesOf(c)[Pipeline::index(warp * kRows + row + t * kStride, part)];
      float value[kElems];
#pragma unroll
      for (int e = 0; e < kElems; ++e) value[e] = toFloat(v.v[e]);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float weight = weightOf(score[g][t], top[g]);
        sum[g] += weight;
#pragma unroll
        for (int e = 0; e < kElems; ++e) acc[g][e] = fmaf(weight, value[e], acc[g][e]);
      }
    }
  }
  pipeline.finish();

  // The row groups of a warp merge by shuffles, lane with lane of the same part of the row.
#pragma unroll
  for (int offset = kLanes; offset < 32; offset <<= 1) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float otherMax = __shfl_xor_sync(0xffffffffu, max[g], offset);
      const float otherSum = __shfl_xor_sync(0xffffffffu, sum[g], offset);
      const float both = fmaxf(max[g], otherMax);
      const float mine = weightOf(max[g], both), theirs = weightOf(otherMax, both);
      sum[g] = sum[g] * mine + otherSum * theirs;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const float otherAcc = __shfl_xor_sync(0xffffffffu, acc[g][e], offset);
        acc[g][e] = acc[g][e] * mine + otherAcc * theirs;
      }
      max[g] = both;
    }
  }
  const Partials partials(shared);
  if (row == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (part == 0) partials.max[warp][g] = max[g], partials.sum[warp][g] = sum[g];
#pragma unroll
      for (int e = 0; e < kElems; ++e) partials.acc[warp][g][part * kElems + e] = acc[g][e];
    }
  }
  partials.template writeOutput<T>(a, seq, kvHead);
}

// ---- tensor cores: bf16 with head_dim 64 or 128 ----
//
// m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4 * g + t:
// A (16 x 16) a0 = A[g][2t, 2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
// B (16 x 8)  b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g];
// C (16 x 8)  c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].
// Scores: A = the query heads (rows; those past kGroup and rows 8-15 are zeros), B = the keys of
// 8 positions. Output: A = the weights of the warp's 16 positions (from the score fragments, in
// bf16), B = the values of those positions for 8 of the dims.

__device__ __forceinline__ void mma16816(float (&c)[4], unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void loadMatrices(unsigned (&r)[4], const void* row) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}
__device__ __forceinline__ void loadMatricesTransposed(unsigned (&r)[4], const void* row) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}
__device__ __forceinline__ unsigned packBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

constexpr int kMmaChunk = kWarps * 16;  // positions per chunk: 16 per warp

template <int kDim, int kStages>
constexpr int mmaSharedBytes() {
  return maxOf<ChunkPipeline<Bf16, kDim, kMmaChunk, kStages>::kBytes, WarpPartials<8, kDim>::kBytes>;
}

template <int kDim, int kGroup, int kStages>
__global__ void __launch_bounds__(kThreads) mmaDecodeKernel(PagedDecodeArgs a) {
  using Pipeline = ChunkPipeline<Bf16, kDim, kMmaChunk, kStages>;
  using Partials = WarpPartials<kGroup, kDim>;
  constexpr int kSteps = kDim / 16;    // k-steps of the scores
  constexpr int kDimTiles = kDim / 8;  // n-tiles of the output
  extern __shared__ __align__(16) unsigned char shared[];

  const int64_t seq = blockIdx.x;
  const int kvHead = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // this lane's row (query head) and column pair
  Pipeline pipeline(a, shared, seq, kvHead);

  // Row g of the query as A fragments (a1 and a3, rows 8-15, are zero).
  unsigned query[kSteps][2];
  const unsigned* q = reinterpret_cast<const unsigned*>(static_cast<const Bf16*>(a.q) +
                                                        (seq * a.heads + int64_t(kvHead) * kGroup + g) * kDim);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    query[s][0] = g < kGroup ? q[s * 8 + t] : 0u;
    query[s][1] = g < kGroup ? q[s * 8 + 4 + t] : 0u;
  }
  // Row g's running softmax over this warp's positions: max and this lane's part of the sum
  // (its columns), and its output columns 2t, 2t + 1 of each n-tile (c2, c3: rows 8-15, zero).
  float max = -kInf, sum = 0;
  float out[kDimTiles][4];
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0;

  for (int c = 0; c < pipeline.chunks; ++c) {
    pipeline.advance(c);
    const unsigned char* keys = reinterpret_cast<const unsigned char*>(pipeline.keysOf(c));
    const unsigned char* values = reinterpret_cast<const unsigned char*>(pipeline.valuesOf(c));
    const int base = warp * 16;  // the warp's first position in the chunk
    // Scores of the warp's positions base .. base + 15: two n-tiles of 8.
    float score[2][4] = {};
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      // Matrices: positions base + 0-7 and base + 8-15, each at pieces 2s and 2s + 1.
      const int position = base + lane % 8 + (lane / 16) * 8, piece = 2 * s + (lane / 8) % 2;
      unsigned k[4];
      loadMatrices(k, keys + Pipeline::index(position, piece) * 16);
      mma16816(score[0], query[s][0], query[s][1], k[0], k[1]);
      mma16816(score[1], query[s][0], query[s][1], k[2], k[3]);
    }
    const int chunkFirst = pipeline.first + c * kMmaChunk + base;
    float top = max;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const bool valid = chunkFirst + n * 8 + 2 * t + i < pipeline.context;
        score[n][i] = valid ? score[n][i] * (a.scale * kLog2e) : -kInf;
        top = fmaxf(top, score[n][i]);
      }
    }
    // The row's max over the four lanes that hold its columns.
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
    const float rescale = weightOf(max, top);
    max = top;
    sum *= rescale;
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) out[n][0] *= rescale, out[n][1] *= rescale;
    float weight[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        weight[n][i] = weightOf(score[n][i], top);
        sum += weight[n][i];
      }
    }
    // A weight in bf16 alone would be off by up to 2^-9 of itself, enough to move an output
    // that is a small difference of large terms by percents: each weight goes in as the sum of
    // two bf16 (its rounding and the rounding of the rest), within 2^-17 of the fp32 weight.
    unsigned high[2], low[2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(weight[n][0], weight[n][1]);
      high[n] = *reinterpret_cast<const unsigned*>(&h);
      low[n] = packBf16(weight[n][0] - __low2float(h), weight[n][1] - __high2float(h));
    }
#pragma unroll
    for (int n = 0; n < kDimTiles; n += 2) {
      // Matrices: positions base + 0-7 and base + 8-15 at piece n, then the same at piece n + 1.
      const int position = base + lane % 8 + ((lane / 8) % 2) * 8, piece = n + lane / 16;
      unsigned v[4];
      loadMatricesTransposed(v, values + Pipeline::index(position, piece) * 16);
      mma16816(out[n], high[0], high[1], v[0], v[1]);
      mma16816(out[n], low[0], low[1], v[0], v[1]);
      mma16816(out[n + 1], high[0], high[1], v[2], v[3]);
      mma16816(out[n + 1], low[0], low[1], v[2], v[3]);
    }
  }
  pipeline.finish();

  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  const Partials partials(shared);
  if (g < kGroup) {
    if (t == 0) partials.max[warp][g] = max, partials.sum[warp][g] = sum;
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      partials.acc[warp][g][n * 8 + 2 * t] = out[n][0];
      partials.acc[warp][g][n * 8 + 2 * t + 1] = out[n][1];
    }
  }
  partials.template writeOutput<Bf16>(a, seq, kvHead);
}

// ---- launch ----

// Chunks in shared memory per block: the one being scored and the next two, in flight. A block's
// warps wait on their own arithmetic about as long as on memory; two chunks in flight rather than
// one took the decode step's attention from 0.90 to 0.85 ms on an H100 (docs/benchmarks.md).
constexpr int kStages = 3;

template <int kDim, int kGroup>
cudaError_t launchMma(const PagedDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = mmaSharedBytes<kDim, kStages>();
  auto* kernel = mmaDecodeKernel<kDim, kGroup, kStages>;
  if (bytes > 48 * 1024) {
    // Past 48 KiB a kernel must ask for its shared memory; once per kernel is enough.
    static const cudaError_t asked = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (asked != cudaSuccess) return asked;
  }
  kernel<<<grid, kThreads, bytes, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, int kDim, int kGroup>
cudaError_t launchFor(const PagedDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, Bf16> && kDim >= 64) {
    return launchMma<kDim, kGroup>(a, grid, stream);
  } else {
    lanesDecodeKernel<T, kDim, kGroup, kStages><<<grid, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
  }
}

template <typename T, int kDim>
cudaError_t launchForDim(const PagedDecodeArgs& a, dim3 grid, cudaStream_t stream) {
  switch (a.heads / a.kvHeads) {
    case 1: return launchFor<T, kDim, 1>(a, grid, stream);
    case 2: return launchFor<T, kDim, 2>(a, grid, stream);
    case 4: return launchFor<T, kDim, 4>(a, grid, stream);
    case 8: return launchFor<T, kDim, 8>(a, grid, stream);
    default: return cudaErrorInvalidValue;  // pagedDecodeSupported() refused it first
  }
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
  // The kernels copy the cache in 16-byte pieces.
  if (reinterpret_cast<uintptr_t>(a.keyCache) % 16 != 0 || reinterpret_cast<uintptr_t>(a.valueCache) % 16 != 0)
    return cudaErrorMisalignedAddress;
  const dim3 grid(static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.kvHeads));
  PagedDecodeArgs args = a;
  args.blockShift = (a.blockSize & (a.blockSize - 1)) == 0 ? __builtin_ctzll(static_cast<uint64_t>(a.blockSize)) : -1;
  return a.dtype == LOOM_DTYPE_BF16 ? launchForType<Bf16>(args, grid, stream)
                                    : launchForType<float>(args, grid, stream);
}

}  // namespace loom::kernels::gpu
