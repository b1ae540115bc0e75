#pragma once

// The CPU plugin's per-instruction-set kernels. plugin.cc checks a call's arguments, splits the
// work into ranges and runs one IsaKernels entry over each range; isa_scalar.cc, isa_avx2.cc and
// isa_avx512.cc each compile the same kernels (kernels_impl.h) for one instruction set.

#include <cstdint>
#include <cstring>

#include "kernels/loom_kernel_abi.h"

namespace loom::kernels::cpu {

// A bf16 element: the upper half of an fp32.
struct Bf16 {
  uint16_t bits;
};

inline float toFloat(float v) { return v; }
inline float toFloat(Bf16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
// Round to nearest even, as c10::BFloat16 does; NaN stays NaN.
inline Bf16 toBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  if (v != v) return {0x7fc0};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<uint16_t>(bits >> 16)};
}
template <typename T>
inline T fromFloat(float v);
template <>
inline float fromFloat<float>(float v) {
  return v;
}
template <>
inline Bf16 fromFloat<Bf16>(float v) {
  return toBf16(v);
}

struct RmsNormArgs {
  loom_dtype dtype;
  const void* x;
  const void* weight;
  const void* dy;       // backward
  const float* rstdIn;  // backward, may be null
  void* y;              // forward
  float* rstdOut;       // forward, may be null
  void* dx;             // backward
  int64_t dim;
  float eps;
};

struct RopeArgs {
  loom_dtype dtype;
  void* q;
  void* k;
  const void* cos;
  const void* sin;
  int64_t qRows;  // batch * qHeads * seq; rows past it are k's
  int64_t qHeads, kHeads, seq, headDim, cosBatchStride;
  bool backward;
};

struct SwigluArgs {
  loom_dtype dtype;
  const void* gate;
  const void* up;
  const void* dout;  // backward
  void* out;         // forward
  void* dgate;       // backward
  void* dup;         // backward
};

enum class VocabOp { kCrossEntropyForward, kCrossEntropyBackward, kLogprobs, kEntropy, kKlDivergence, kGreedy };

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
  int64_t vocab;
  int64_t ignoreIndex;
};

struct OptimizerTensors {
  loom_dtype paramDtype, gradDtype;
  void* param;
  const void* grad;
  float* first;   // exp_avg (Adam, Lion), sum (Adagrad)
  float* second;  // exp_avg_sq (Adam)
};

// The scalars as torch.optim rounds them to fp32 (see plugin.cc).
struct AdamArgs {
  OptimizerTensors t;
  float lerpWeight;  // 1 - beta1
  float beta2, oneMinusBeta2;
  float negStepSize;  // -lr / (1 - beta1^t)
  float bc2Sqrt;      // sqrt(1 - beta2^t)
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

// Each entry processes a range of rows (or of elements for the elementwise ops).
struct IsaKernels {
  const char* name;
  void (*rmsNormForward)(const RmsNormArgs& a, int64_t begin, int64_t end);
  // Adds this range's sum of dy * h to dweight (fp32 [dim]).
  void (*rmsNormBackward)(const RmsNormArgs& a, int64_t begin, int64_t end, float* dweight);
  void (*rope)(const RopeArgs& a, int64_t begin, int64_t end);
  void (*swigluForward)(const SwigluArgs& a, int64_t begin, int64_t end);
  void (*swigluBackward)(const SwigluArgs& a, int64_t begin, int64_t end);
  void (*vocab)(const VocabArgs& a, int64_t begin, int64_t end);
  void (*adam)(const AdamArgs& a, int64_t begin, int64_t end);
  void (*lion)(const LionArgs& a, int64_t begin, int64_t end);
  void (*adagrad)(const AdagradArgs& a, int64_t begin, int64_t end);
};

const IsaKernels& scalarKernels();
// Only call these where the processor has the instruction set (plugin.cc checks with cpuid).
const IsaKernels& avx2Kernels();
const IsaKernels& avx512Kernels();

}  // namespace loom::kernels::cpu
