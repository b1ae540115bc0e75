#pragma once

// Ops the CPU plugin writes once in plain C++ for every instruction set (the compiler vectorizes
// what it can): the masked softmax, GPT-OSS's clamped SwiGLU, rollout's paged decode attention
// and RoPE into the KV cache, and the residual add before a norm. plugin.cc checks a call and
// runs these over ranges, as it does the per-instruction-set kernels of cpu_kernels.h.

#include <cstdint>

#include "kernels/loom_kernel_abi.h"

namespace loom::kernels::cpu {

struct MaskedSoftmaxArgs {
  loom_dtype dtype;
  const void* x;         // forward
  const uint8_t* mask;   // forward, may be null (every entry)
  const void* y;         // backward: the forward's output
  const void* dy;        // backward
  void* out;             // y (forward) or dx (backward)
  int64_t cols;
  float scale;
};
// Rows [begin, end).
void maskedSoftmaxForwardRows(const MaskedSoftmaxArgs& a, int64_t begin, int64_t end);
void maskedSoftmaxBackwardRows(const MaskedSoftmaxArgs& a, int64_t begin, int64_t end);

struct ClampedSwigluArgs {
  loom_dtype dtype;
  const void* gate;
  const void* up;
  const void* dout;  // backward
  void* out;         // forward
  void* dgate;       // backward
  void* dup;         // backward
  float alpha, limit;
};
// Elements [begin, end).
void clampedSwigluForwardRange(const ClampedSwigluArgs& a, int64_t begin, int64_t end);
void clampedSwigluBackwardRange(const ClampedSwigluArgs& a, int64_t begin, int64_t end);

struct PagedDecodeArgs {
  loom_dtype dtype;
  const void* q;           // [seqs, heads, dim]
  const void* keyCache;    // [blocks, blockSize, kvHeads, dim]
  const void* valueCache;
  const int64_t* blockTables;  // [seqs, maxBlocks]
  const int64_t* contextLens;  // [seqs]
  void* out;               // [seqs, heads, dim]
  int64_t heads, kvHeads, dim, blockSize, maxBlocks, window;
  float scale;
};
// Query rows [begin, end) of seqs * heads: each over its sequence's keys and values through the
// block table, with a running softmax in fp32.
void pagedDecodeRows(const PagedDecodeArgs& a, int64_t begin, int64_t end);

struct RopeKvWriteArgs {
  loom_dtype dtype;
  const void* q;  // [tokens, heads, dim], token rows qStride apart
  const void* k;  // [tokens, kvHeads, dim], token rows kvStride apart
  const void* v;
  int64_t qStride, kvStride;
  const void* qNorm;  // [dim] or null (then kNorm is null too)
  const void* kNorm;
  float eps;
  const void* cos;  // [tokens, dim]
  const void* sin;
  const int64_t* slots;  // [tokens]
  void* qOut;            // [tokens, heads, dim]
  void* keyCache;        // [rows, kvHeads, dim]
  void* valueCache;
  int64_t heads, kvHeads, dim;
};
// Tokens [begin, end): q and k normalized (with norms) and rotated, into qOut and the key cache;
// v into the value cache.
void ropeKvWriteTokens(const RopeKvWriteArgs& a, int64_t begin, int64_t end);

// sum = x + residual over elements [begin, end), rounded to dtype as a torch add rounds it.
void addRange(loom_dtype dtype, const void* x, const void* residual, void* sum, int64_t begin, int64_t end);

}  // namespace loom::kernels::cpu
