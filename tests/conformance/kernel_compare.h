#pragma once

// The comparison side of the kernel conformance tests, shared by the CPU suite
// (kernel_conformance.h) and the CUDA one: fresh random inputs, per-op tolerances, element-wise
// checks against the reference, and the bookkeeping of an optimizer comparison. Needs no plugin.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "kernels/loom_kernel_abi.h"

namespace loom::testing {

// The seed of this process's random inputs: LOOM_TEST_SEED if set, else fresh; printed once.
uint64_t testSeed();
// randn in fp32 on the CPU, then cast: both implementations get the same values in `dtype`.
at::Tensor randomInput(at::IntArrayRef sizes, loom_dtype dtype, double scale = 1.0);

// |actual - expected| <= rtol * |expected| + atol, element by element (both read as fp64).
struct Tolerance {
  double rtol;
  double atol;
};
// The tolerance of an op for `dtype`: fp32 1e-6 relative, bf16 2^-6 relative (two units in the last
// place of its 8-bit significand: a kernel and the reference may each round an intermediate to
// bf16 at a different point, as rms_norm's x * rstd before the weight). `termScale` is the
// magnitude of the terms the result is summed or differenced from (e.g. the largest |input| of a
// rotation): where the result cancels, the rounding error is relative to the terms, not to the
// result, so an absolute part of rtol * termScale is the same bound written for such elements.
Tolerance tolerance(loom_dtype dtype, double termScale);
// Checks, and on failure reports the worst element with both values, the tolerance and `what`.
// `terms` (optional, the shape of `expected`) adds rtol * terms element by element: the size of
// the terms each element was computed from, where that is known per element. Tensors may be on
// any device (they are compared on the CPU).
void requireClose(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol, const std::string& what,
                  const at::Tensor& terms = {});

// One call of rope_kv_write and what the reference's ops make of it (rms_norm per head, rope,
// then the cache rows written): random CPU inputs in `dtype`. With `fused`, q, k and v are views
// of one projection [tokens, (heads + 2 kv_heads) dim], as the model hands them over; else each
// its own contiguous tensor (k and v of equal strides).
struct RopeKvWriteCase {
  int64_t tokens, heads, kvHeads, dim;
  double eps;
  at::Tensor projection;    // fused: [tokens, heads + 2 kvHeads, dim], which q, k and v are views of
  at::Tensor q, k, v;       // [tokens, heads or kvHeads, dim] with token rows qStride / kvStride apart
  int64_t qStride, kvStride;
  at::Tensor qNorm, kNorm;  // [dim], undefined without norms
  at::Tensor cos, sin;      // [tokens, dim]
  at::Tensor slots;         // [tokens], distinct rows of the caches
  at::Tensor keyCache, valueCache;            // [rows, kvHeads, dim], random before the call
  at::Tensor expectedQ, expectedKeys, expectedValues;  // the reference's q_out and caches after it
};
RopeKvWriteCase ropeKvWriteCase(int64_t tokens, int64_t heads, int64_t kvHeads, int64_t dim, bool norms, bool fused,
                                loom_dtype dtype);

// Logits for greedy_logprobs, random in `dtype`, and what torch makes of them (at::argmax, then
// log_softmax at the pick). Where there are 3 rows and 8 entries or more, row 0 has its largest
// value twice (the first is the pick) and row 1 two NaNs (the first is the pick, its logprob NaN).
struct GreedyCase {
  at::Tensor logits;            // [rows, vocab]
  at::Tensor tokens, logprobs;  // int64 and fp64 [rows]
};
GreedyCase greedyCase(int64_t rows, int64_t vocab, loom_dtype dtype);
// The picks equal torch's; the logprobs are within fp32 rounding of log-sum-exps of the logits'
// size, and NaN exactly where torch's are.
void checkGreedy(const GreedyCase& c, const at::Tensor& tokens, const at::Tensor& logprobs, const std::string& what);

inline const char* dtypeName(loom_dtype dtype) { return dtype == LOOM_DTYPE_BF16 ? "bf16" : "fp32"; }

// One side of an optimizer comparison: the param and its state (`second` undefined for
// optimizers with one state tensor).
struct OptimizerState {
  at::Tensor param, first, second;
  OptimizerState copy() const;
};

// The size of the terms each element of the outputs was summed from, over the steps so far: a
// step adds to x an update d, rounding relative to |x| + |d|, and a later step carries that
// error on. Where x passes near 0 (a param decaying through it, a moment changing sign) its
// error stays relative to these terms, not to x.
struct OptimizerTerms {
  at::Tensor param, first, second;

  static OptimizerTerms of(const OptimizerState& s);
  // Around one step of the reference: `before` is a copy of its state from before the step.
  void add(const OptimizerState& before, const OptimizerState& after);
};

// The param in its dtype's tolerance; the fp32 state at fp32's, except after bf16 params: they
// are rounded every step, so the two sides may hold params one bf16 ulp apart from some step on
// and their states follow at bf16's tolerance.
void compareOptimizerStates(const OptimizerState& mine, const OptimizerState& ref, const OptimizerTerms& terms,
                            loom_dtype paramDtype, const std::string& what);

}  // namespace loom::testing
