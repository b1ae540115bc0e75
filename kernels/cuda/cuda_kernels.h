#pragma once

// The CUDA plugin's launchers. plugin.cc checks a call's arguments and calls one of these; each
// enqueues its kernels on `stream` and returns the first launch error (cudaSuccess when all were
// enqueued). None synchronizes the stream. Pointers are device memory; sizes are element counts
// and are > 0 (plugin.cc returns early on empty calls, which would be invalid launches).
// The kernels are in layer_kernels.cu, vocab_kernels.cu and optimizer_kernels.cu.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/loom_kernel_abi.h"

namespace loom::kernels::gpu {

struct RmsNormArgs {
  loom_dtype dtype;
  const void* x;
  const void* weight;
  const void* dy;       // backward
  const float* rstdIn;  // backward, may be null (recomputed)
  void* y;              // forward
  float* rstdOut;       // forward, may be null
  void* dx;             // backward
  float* dweight;       // backward, fp32 [dim], overwritten
  int64_t rows, dim;
  float eps;
};
cudaError_t launchRmsNormForward(const RmsNormArgs& a, cudaStream_t stream);
// rows > 0. Sums dweight without atomics: each of a fixed number of blocks sums its rows into a
// partial in shared memory, a second kernel adds the partials in a fixed order (deterministic).
cudaError_t launchRmsNormBackward(const RmsNormArgs& a, cudaStream_t stream);
// The largest dim rms_norm_backward takes on the current device (its partial of dweight lives in
// one block's shared memory); 0 when the device cannot be queried.
int64_t rmsNormBackwardMaxDim();

// add_rms_norm (layer_kernels.cu): sum = x + residual, y = RMSNorm(sum), one block per row.
struct AddRmsNormArgs {
  loom_dtype dtype;
  const void* x;
  const void* residual;
  const void* weight;
  void* sum;
  void* y;
  int64_t rows, dim;
  float eps;
};
cudaError_t launchAddRmsNorm(const AddRmsNormArgs& a, cudaStream_t stream);
// The largest dim add_rms_norm takes: a row's sums live in one block's registers.
int64_t addRmsNormMaxDim(loom_dtype dtype);

struct RopeArgs {
  loom_dtype dtype;
  void* q;
  void* k;
  const void* cos;
  const void* sin;
  int64_t qRows, kRows;  // batch * heads * seq of each
  int64_t qHeads, kHeads, seq, headDim, cosBatchStride;
  bool backward;
};
cudaError_t launchRope(const RopeArgs& a, cudaStream_t stream);

// rope_kv_write (layer_kernels.cu): rollout's q, k and v of a step's tokens, normalized (optional),
// rotated and written where attention reads them.
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
  int64_t tokens, heads, kvHeads, dim;
};
cudaError_t launchRopeKvWrite(const RopeKvWriteArgs& a, cudaStream_t stream);

struct SwigluArgs {
  loom_dtype dtype;
  const void* gate;
  const void* up;
  const void* dout;  // backward
  void* out;         // forward
  void* dgate;       // backward
  void* dup;         // backward
  int64_t n;
};
cudaError_t launchSwigluForward(const SwigluArgs& a, cudaStream_t stream);
cudaError_t launchSwigluBackward(const SwigluArgs& a, cudaStream_t stream);

// GPT-OSS's clamped SwiGLU (gating_kernels.cu), the SwigluArgs tensors with its constants.
struct ClampedSwigluArgs {
  SwigluArgs tensors;
  float alpha, limit;
  bool backward;
};
cudaError_t launchClampedSwiglu(const ClampedSwigluArgs& a, cudaStream_t stream);

// The masked softmax (gating_kernels.cu): one block per row.
struct MaskedSoftmaxArgs {
  loom_dtype dtype;
  const void* x;        // forward
  const uint8_t* mask;  // forward, may be null
  const void* y;        // backward: the forward's output
  const void* dy;       // backward
  void* out;            // y (forward) or dx (backward)
  int64_t rows, cols;
  float scale;
  bool backward;
};
cudaError_t launchMaskedSoftmax(const MaskedSoftmaxArgs& a, cudaStream_t stream);

// A label outside [0, vocab) (and not ignore_index) found by a kernel: the row's outputs are
// written as NaN and the kernel stores one 64-bit record into host memory the device can write
// (plugin.cc reads it at the next call that takes labels). Layout of the record:
//   bit 63: set; bits 60-62: the VocabOp + 1; bits 32-59: the row, saturated at kBadRowMax;
//   bits 0-31: the label as int32, saturated.
// One word, written by one store, so two bad rows racing leave one whole record, never a mix.
constexpr uint64_t kBadLabelSet = 1ull << 63;
constexpr int64_t kBadRowMax = (1ll << 28) - 1;

enum class VocabOp : int { kCrossEntropyForward, kCrossEntropyBackward, kLogprobs, kEntropy, kKlDivergence, kGreedy };

struct VocabArgs {
  VocabOp op;
  loom_dtype dtype;
  const void* logits;
  const void* logitsQ;    // KL
  const int64_t* labels;  // cross-entropy, logprobs
  const float* lseIn;     // cross-entropy backward, may be null
  const float* dloss;     // cross-entropy backward
  float* out;             // loss, logprob, entropy, KL
  int64_t* tokensOut;     // greedy: each row's argmax
  float* lseOut;          // cross-entropy forward, may be null
  void* dlogits;          // cross-entropy backward
  int64_t rows, vocab;
  int64_t ignoreIndex;
  bool ignoring;                   // cross-entropy: rows labelled ignoreIndex are skipped
  unsigned long long* badLabel;    // the record above, device-visible; null: not recorded
};
// One block per row; the row's fp32 values are never stored (online max and sum of exponentials).
cudaError_t launchVocab(const VocabArgs& a, cudaStream_t stream);

struct OptimizerTensors {
  loom_dtype paramDtype, gradDtype;
  void* param;
  const void* grad;
  float* first;   // exp_avg (Adam, Lion), sum (Adagrad)
  float* second;  // exp_avg_sq (Adam)
  int64_t n;
};

// The scalars as torch.optim rounds them to fp32 (plugin.cc computes them as the CPU plugin does).
struct AdamArgs {
  OptimizerTensors t;
  float lerpWeight;  // 1 - beta1
  float beta2, oneMinusBeta2;
  float negStepSize;  // -lr / (1 - beta1^t)
  float invBc2Sqrt;   // 1 / sqrt(1 - beta2^t)
  float eps;
  float decay;        // 1 - lr * wd (decoupled)
  float weightDecay;  // wd (L2)
  bool decoupled;
  bool hasWeightDecay;
};
struct LionArgs {
  OptimizerTensors t;
  float beta1, oneMinusBeta1, beta2, oneMinusBeta2;
  float negLr;
  float decay;  // 1 - lr * wd
  bool hasWeightDecay;
};
struct AdagradArgs {
  OptimizerTensors t;
  float negLr, eps, weightDecay;
  bool hasWeightDecay;
};
cudaError_t launchAdam(const AdamArgs& a, cudaStream_t stream);
cudaError_t launchLion(const LionArgs& a, cudaStream_t stream);
cudaError_t launchAdagrad(const AdagradArgs& a, cudaStream_t stream);

// attention_kernels.cu: rollout's decode attention over the paged KV cache.
struct PagedDecodeArgs {
  loom_dtype dtype;
  const void* q;           // [seqs, heads, dim]
  const void* keyCache;    // [blocks, blockSize, kvHeads, dim]
  const void* valueCache;
  const int64_t* blockTables;  // [seqs, maxBlocks]
  const int64_t* contextLens;  // [seqs]
  void* out;               // [seqs, heads, dim]
  int64_t seqs, heads, kvHeads, dim, blockSize, maxBlocks, window;
  float scale;
  int blockShift = -1;  // log2(blockSize) where it is a power of two; set by launchPagedAttentionDecode
};
// The head layouts the kernel is built for: dim 32, 64 or 128, and 1, 2, 4 or 8 query heads per
// KV head.
bool pagedDecodeSupported(int64_t heads, int64_t kvHeads, int64_t dim);
cudaError_t launchPagedAttentionDecode(const PagedDecodeArgs& a, cudaStream_t stream);

}  // namespace loom::kernels::gpu
