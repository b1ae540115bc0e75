#pragma once

// The decode-attention kernels' shared parts (attention_kernels.cu): the pipeline that brings a
// sequence's keys and values into shared memory chunk by chunk, and the warps' partial softmaxes
// merged into the output rows.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace loom::kernels::gpu::paged {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// The kernels keep scores in base 2 (scaled by log2(e) as well as by the softmax's scale), so
// that a weight is one exp2: 2^(m - top) with top >= m, where m may be -inf: a score that was
// never taken, or a running softmax that saw nothing (and top may then be -inf too).
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float weightOf(float m, float top) { return m == -kInf ? 0.0f : exp2f(m - top); }

// 16 bytes from global to shared memory, asynchronously; zeros where `valid` is false.
__device__ __forceinline__ void copyAsync16(void* shared, const void* global, bool valid) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(global), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commitCopies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void waitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The keys and values of one (sequence, KV head), chunk by chunk through kStages buffers of
// shared memory. A row (one position's dim elements) is kPieces pieces of 16 bytes; rows of 8
// pieces or more are stored swizzled (piece p of position i at p ^ (i % 8)), so that 8 lanes
// reading the same piece of 8 positions hit 8 different banks.
template <typename T, int kDim, int kChunk, int kStages>
struct ChunkPipeline {
  using Piece = Pack<T, 16 / sizeof(T)>;
  static constexpr int kPieces = kDim * int(sizeof(T)) / 16;
  static constexpr int kCopies = kChunk * kPieces / kThreads;  // pieces per thread per chunk, each of K and V
  static_assert(kCopies >= 1 && kChunk * kPieces % kThreads == 0, "a chunk's pieces share out evenly");
  static constexpr int kStageBytes = 2 * kChunk * kDim * int(sizeof(T));
  static constexpr int kBytes = kStages * kStageBytes;

  unsigned char* shared;
  const T* keys;
  const T* values;
  const int64_t* table;
  int64_t slotStride;  // elements between two positions of the cache
  int first, context, chunks, blockSize;
  int blockShift;  // PagedDecodeArgs::blockShift
  int64_t slots[kCopies];  // the next chunk to copy: this thread's pieces' slots, -1 past the end

  static __device__ __forceinline__ int index(int position, int piece) {
    return position * kPieces + (kPieces >= 8 ? piece ^ (position & 7) : piece);
  }
  __device__ const Piece* keysOf(int c) const { return reinterpret_cast<const Piece*>(shared + c % kStages * kStageBytes); }
  __device__ const Piece* valuesOf(int c) const { return keysOf(c) + kChunk * kPieces; }

  // Starts the copies of the first kStages - 1 chunks.
  __device__ ChunkPipeline(const PagedDecodeArgs& a, unsigned char* sharedMemory, int64_t seq, int kvHead)
      : shared(sharedMemory),
        keys(static_cast<const T*>(a.keyCache) + int64_t(kvHead) * kDim),
        values(static_cast<const T*>(a.valueCache) + int64_t(kvHead) * kDim),
        table(a.blockTables + seq * a.maxBlocks),
        slotStride(a.kvHeads * kDim),
        // Positions fit 32 bits (a context of 2^31 tokens would not fit the cache); slots may not.
        context(static_cast<int>(a.contextLens[seq])),
        blockSize(static_cast<int>(a.blockSize)),
        blockShift(a.blockShift) {
    first = a.window > 0 && context > a.window ? context - static_cast<int>(a.window) : 0;
    chunks = (context - first + kChunk - 1) / kChunk;
#pragma unroll
    for (int c = 0; c < kStages - 1; ++c) {
      lookUp(c);
      copy(c);
    }
    lookUp(kStages - 1);
  }
  // Piece threadIdx.x + j * kThreads of a chunk is piece (that % kPieces) of the chunk's position
  // (that / kPieces).
  __device__ void lookUp(int c) {
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      const int p = first + c * kChunk + (threadIdx.x + j * kThreads) / kPieces;
      // A division by a value known only at run time costs tens of instructions, per piece per chunk.
      const int entry = blockShift >= 0 ? p >> blockShift : p / blockSize;
      slots[j] = c < chunks && p < context ? table[entry] * blockSize + (p - entry * blockSize) : -1;
    }
  }
  __device__ void copy(int c) {
    if (c < chunks) {
      Piece* stage = reinterpret_cast<Piece*>(shared + c % kStages * kStageBytes);
#pragma unroll
      for (int j = 0; j < kCopies; ++j) {
        const int i = threadIdx.x + j * kThreads, position = i / kPieces, piece = i % kPieces;
        const int64_t offset = (slots[j] < 0 ? 0 : slots[j] * slotStride) + piece * (16 / int(sizeof(T)));
        copyAsync16(stage + index(position, piece), keys + offset, slots[j] >= 0);
        copyAsync16(stage + kChunk * kPieces + index(position, piece), values + offset, slots[j] >= 0);
      }
    }
    commitCopies();  // an empty group past the end keeps the count of groups in step
  }
  // Waits for chunk c; every warp is then done with chunk c - 1, whose buffer takes the copy of
  // chunk c + kStages - 1.
  __device__ void advance(int c) {
    waitCopies<kStages - 2>();
    __syncthreads();
    copy(c + kStages - 1);
    lookUp(c + kStages);
  }
  // No copy may land in the shared memory once the block reuses it.
  __device__ void finish() {
    waitCopies<0>();
    __syncthreads();
  }
};

// The warps' running softmaxes in shared memory (after the pipeline is done with it): per warp
// and query head the max, the sum and the weighted values. Combines them into the output rows.
template <int kGroup, int kDim>
struct WarpPartials {
  float (*max)[kGroup];
  float (*sum)[kGroup];
  float (*acc)[kGroup][kDim];
  static constexpr int kBytes = kWarps * kGroup * (kDim + 2) * int(sizeof(float));

  __device__ explicit WarpPartials(unsigned char* shared)
      : max(reinterpret_cast<float(*)[kGroup]>(shared)),
        sum(reinterpret_cast<float(*)[kGroup]>(shared + kWarps * kGroup * sizeof(float))),
        acc(reinterpret_cast<float(*)[kGroup][kDim]>(shared + 2 * kWarps * kGroup * sizeof(float))) {}

  template <typename T>
  __device__ void writeOutput(const PagedDecodeArgs& a, int64_t seq, int kvHead) const {
    __syncthreads();
    T* out = static_cast<T*>(a.out);
    for (int i = threadIdx.x; i < kGroup * kDim; i += kThreads) {
      const int g = i / kDim, d = i % kDim;
      float top = -kInf;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) top = fmaxf(top, max[w][g]);
      float total = 0, value = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        // A warp that saw no position has max -inf and contributes nothing.
        const float scale = weightOf(max[w][g], top);
        total += sum[w][g] * scale;
        value += acc[w][g][d] * scale;
      }
      out[(seq * a.heads + int64_t(kvHead) * kGroup + g) * kDim + d] = fromFloat<T>(value / total);
    }
  }
};

template <int a, int b>
constexpr int maxOf = a > b ? a : b;

}  // namespace loom::kernels::gpu::paged
