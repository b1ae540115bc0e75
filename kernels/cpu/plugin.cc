// libloom_kernels_cpu.so: the CPU kernel plugin. This file is the ABI side: it checks each call,
// picks the instruction set once at init (cpuid), and splits work over threads (the host's
// parallel_for when it passes one, else a pool of its own); the arithmetic is in isa_*.cc.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/portable_ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/loom_kernel_abi.h"
#include "kernels/plugin_checks.h"

namespace loom::kernels::cpu {
namespace {

// ---- state set by init ----

struct Runtime {
  const IsaKernels* isa = nullptr;
  int threads = 1;
  void (*hostParallelFor)(void*, int64_t, int64_t, loom_range_fn, void*) = nullptr;
  void* hostCtx = nullptr;
  std::unique_ptr<ThreadPool> pool;
};

std::mutex gInitMutex;
Runtime gRuntime;
std::atomic<bool> gReady{false};

bool hasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}
bool hasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The best instruction set the processor has, no higher than `limit` (null: no limit).
int pickIsa(const char* limit, const IsaKernels** out) {
  int rank = 2;
  if (limit && *limit) {
    if (std::strcmp(limit, "avx512") == 0) {
      rank = 2;
    } else if (std::strcmp(limit, "avx2") == 0) {
      rank = 1;
    } else if (std::strcmp(limit, "scalar") == 0) {
      rank = 0;
    } else {
      return fail(LOOM_KERNEL_INVALID_ARGUMENT,
                  std::string("unknown instruction set '") + limit + "' (expected avx512, avx2 or scalar)");
    }
  }
  if (rank >= 2 && hasAvx512()) {
    *out = &avx512Kernels();
  } else if (rank >= 1 && hasAvx2()) {
    *out = &avx2Kernels();
  } else {
    *out = &scalarKernels();
  }
  return LOOM_KERNEL_OK;
}

int initPlugin(const loom_kernel_host* host);

// Fields a host of an older, shorter loom_kernel_host did not set read as absent.
template <typename T>
T hostField(const loom_kernel_host* host, T loom_kernel_host::*field, size_t offset, T absent) {
  if (!host || host->struct_size < offset + sizeof(T)) return absent;
  return host->*field;
}

// Valid once checkCall() passed.
const Runtime& runtime() { return gRuntime; }

// Runs body(begin, end) over [0, n) on the host's threads or the pool.
template <typename Body>
void parallelFor(int64_t n, int64_t grain, Body&& body) {
  const Runtime& rt = runtime();
  using Fn = std::remove_reference_t<Body>;
  auto trampoline = [](void* ctx, int64_t begin, int64_t end) { (*static_cast<Fn*>(ctx))(begin, end); };
  if (n <= grain || rt.threads <= 1) {
    body(0, n);
  } else if (rt.hostParallelFor) {
    rt.hostParallelFor(rt.hostCtx, n, grain, trampoline, &body);
  } else {
    rt.pool->parallelFor(n, grain, trampoline, &body);
  }
}

// Grains: elementwise ops in 64 KiB-ish ranges whose bounds stay on cache lines; rows by cost.
constexpr int64_t kElementGrain = 16384;
int64_t rowGrain(int64_t rowElements) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(rowElements, 1));
}

// ---- argument checks (before any output is written), beside kernels/plugin_checks.h's ----

int checkLabels(const int64_t* labels, int64_t rows, int64_t vocab, int64_t ignoreIndex, bool ignoring,
                const char* what) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t l = labels[r];
    if (ignoring && l == ignoreIndex) continue;
    if (l < 0 || l >= vocab)
      return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": label " + std::to_string(l) + " of row " +
                                                    std::to_string(r) + " is outside the vocabulary [0, " +
                                                    std::to_string(vocab) + ")");
  }
  return LOOM_KERNEL_OK;
}


// Every op first: no stream on cpu, and a plugin that init configured (a host that skipped init
// gets the defaults now; a bad LOOM_KERNEL_CPU_ISA then fails each call with the reason).
int checkCall(void* stream, const char* what) {
  if (stream) return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": a stream was given to a cpu kernel");
  if (!gReady.load(std::memory_order_acquire)) {
    if (int rc = initPlugin(nullptr); rc != LOOM_KERNEL_OK) return fail(rc, std::string(what) + ": " + tLastError);
  }
  return LOOM_KERNEL_OK;
}

// ---- ops ----

int rmsNormForward(loom_dtype dtype, const void* x, const void* weight, void* y, float* rstd, int64_t rows, int64_t dim,
                   double eps, void* stream) {
  LOOM_CHECK(checkCall(stream, "rms_norm_forward"));
  LOOM_CHECK(checkDtype(dtype, "rms_norm_forward"));
  LOOM_CHECK(checkSizes({rows, dim}, "rms_norm_forward"));
  LOOM_CHECK(checkPointers(rows * dim > 0, {x, weight, y}, "rms_norm_forward"));
  const RmsNormArgs args{
      .dtype = dtype, .x = x, .weight = weight, .y = y, .rstdOut = rstd, .dim = dim, .eps = static_cast<float>(eps)};
  const IsaKernels* isa = runtime().isa;
  parallelFor(rows, rowGrain(dim), [&](int64_t b, int64_t e) { isa->rmsNormForward(args, b, e); });
  return LOOM_KERNEL_OK;
}

int addRmsNorm(loom_dtype dtype, const void* x, const void* residual, const void* weight, void* sum, void* y,
               int64_t rows, int64_t dim, double eps, void* stream) {
  const char* what = "add_rms_norm";
  LOOM_CHECK(checkCall(stream, what));
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({rows, dim}, what));
  LOOM_CHECK(checkPointers(rows * dim > 0, {x, residual, weight, sum, y}, what));
  // The norm is rms_norm_forward's own, on each range's sums while they are in cache.
  const RmsNormArgs args{.dtype = dtype,
                         .x = sum,
                         .weight = weight,
                         .y = y,
                         .rstdOut = nullptr,
                         .dim = dim,
                         .eps = static_cast<float>(eps)};
  const IsaKernels* isa = runtime().isa;
  parallelFor(rows, rowGrain(dim), [&](int64_t b, int64_t e) {
    addRange(dtype, x, residual, sum, b * dim, e * dim);
    isa->rmsNormForward(args, b, e);
  });
  return LOOM_KERNEL_OK;
}

int rmsNormBackward(loom_dtype dtype, const void* x, const void* weight, const void* dy, const float* rstd, void* dx,
                    float* dweight, int64_t rows, int64_t dim, double eps, void* stream) {
  LOOM_CHECK(checkCall(stream, "rms_norm_backward"));
  LOOM_CHECK(checkDtype(dtype, "rms_norm_backward"));
  LOOM_CHECK(checkSizes({rows, dim}, "rms_norm_backward"));
  LOOM_CHECK(checkPointers(rows * dim > 0, {x, weight, dy, dx}, "rms_norm_backward"));
  LOOM_CHECK(checkPointers(dim > 0, {dweight}, "rms_norm_backward"));
  const RmsNormArgs args{.dtype = dtype,
                         .x = x,
                         .weight = weight,
                         .dy = dy,
                         .rstdIn = rstd,
                         .dx = dx,
                         .dim = dim,
                         .eps = static_cast<float>(eps)};
  const IsaKernels* isa = runtime().isa;
  // dweight sums over rows: a fixed number of row blocks (so the result does not depend on the
  // thread count), each into its own partial, then the partials in block order.
  const int64_t blocks = std::min<int64_t>(rows, 16);
  if (blocks == 0) {
    std::fill(dweight, dweight + dim, 0.0f);
    return LOOM_KERNEL_OK;
  }
  std::vector<float> partials(static_cast<size_t>(blocks * dim), 0.0f);
  parallelFor(blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk)
      isa->rmsNormBackward(args, rows * blk / blocks, rows * (blk + 1) / blocks, partials.data() + blk * dim);
  });
  parallelFor(dim, kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float s = partials[static_cast<size_t>(i)];
      for (int64_t blk = 1; blk < blocks; ++blk) s += partials[static_cast<size_t>(blk * dim + i)];
      dweight[i] = s;
    }
  });
  return LOOM_KERNEL_OK;
}

int ropeRun(bool backward, loom_dtype dtype, void* q, void* k, const void* cos, const void* sin, int64_t batch,
            int64_t qHeads, int64_t kHeads, int64_t seq, int64_t headDim, int64_t cosBatchStride, void* stream) {
  const char* what = backward ? "rope_backward" : "rope_forward";
  LOOM_CHECK(checkCall(stream, what));
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({batch, qHeads, kHeads, seq, headDim, cosBatchStride}, what));
  if (headDim % 2 != 0) return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": head_dim must be even");
  const int64_t qRows = batch * qHeads * seq, kRows = batch * kHeads * seq;
  LOOM_CHECK(checkPointers(qRows > 0, {q}, what));
  LOOM_CHECK(checkPointers(kRows > 0, {k}, what));
  LOOM_CHECK(checkPointers(qRows + kRows > 0 && headDim > 0, {cos, sin}, what));
  const RopeArgs args{.dtype = dtype,
                      .q = q,
                      .k = k,
                      .cos = cos,
                      .sin = sin,
                      .qRows = qRows,
                      .qHeads = qHeads,
                      .kHeads = kHeads,
                      .seq = seq,
                      .headDim = headDim,
                      .cosBatchStride = cosBatchStride,
                      .backward = backward};
  const IsaKernels* isa = runtime().isa;
  parallelFor(qRows + kRows, rowGrain(headDim), [&](int64_t b, int64_t e) { isa->rope(args, b, e); });
  return LOOM_KERNEL_OK;
}

int ropeForward(loom_dtype dtype, void* q, void* k, const void* cos, const void* sin, int64_t batch, int64_t qHeads,
                int64_t kHeads, int64_t seq, int64_t headDim, int64_t cosBatchStride, void* stream) {
  return ropeRun(false, dtype, q, k, cos, sin, batch, qHeads, kHeads, seq, headDim, cosBatchStride, stream);
}
int ropeBackward(loom_dtype dtype, void* dq, void* dk, const void* cos, const void* sin, int64_t batch, int64_t qHeads,
                 int64_t kHeads, int64_t seq, int64_t headDim, int64_t cosBatchStride, void* stream) {
  return ropeRun(true, dtype, dq, dk, cos, sin, batch, qHeads, kHeads, seq, headDim, cosBatchStride, stream);
}

int swigluForward(loom_dtype dtype, const void* gate, const void* up, void* out, int64_t n, void* stream) {
  LOOM_CHECK(checkCall(stream, "swiglu_forward"));
  LOOM_CHECK(checkDtype(dtype, "swiglu_forward"));
  LOOM_CHECK(checkSizes({n}, "swiglu_forward"));
  LOOM_CHECK(checkPointers(n > 0, {gate, up, out}, "swiglu_forward"));
  const SwigluArgs args{.dtype = dtype, .gate = gate, .up = up, .out = out};
  const IsaKernels* isa = runtime().isa;
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) { isa->swigluForward(args, b, e); });
  return LOOM_KERNEL_OK;
}

int swigluBackward(loom_dtype dtype, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                   int64_t n, void* stream) {
  LOOM_CHECK(checkCall(stream, "swiglu_backward"));
  LOOM_CHECK(checkDtype(dtype, "swiglu_backward"));
  LOOM_CHECK(checkSizes({n}, "swiglu_backward"));
  LOOM_CHECK(checkPointers(n > 0, {gate, up, dout, dgate, dup}, "swiglu_backward"));
  const SwigluArgs args{.dtype = dtype, .gate = gate, .up = up, .dout = dout, .dgate = dgate, .dup = dup};
  const IsaKernels* isa = runtime().isa;
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) { isa->swigluBackward(args, b, e); });
  return LOOM_KERNEL_OK;
}

int runVocab(const VocabArgs& args, int64_t rows, const char* what) {
  LOOM_CHECK(checkDtype(args.dtype, what));
  LOOM_CHECK(checkSizes({rows, args.vocab}, what));
  if (rows > 0 && args.vocab == 0) return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": vocab is 0");
  const IsaKernels* isa = runtime().isa;
  parallelFor(rows, rowGrain(args.vocab), [&](int64_t b, int64_t e) { isa->vocab(args, b, e); });
  return LOOM_KERNEL_OK;
}

int crossEntropyForward(loom_dtype dtype, const void* logits, const int64_t* labels, int64_t rows, int64_t vocab,
                        int64_t ignoreIndex, float* loss, float* lse, void* stream) {
  const char* what = "cross_entropy_forward";
  LOOM_CHECK(checkCall(stream, what));
  LOOM_CHECK(checkPointers(rows > 0, {logits, labels, loss}, what));
  LOOM_CHECK(checkLabels(labels, rows, vocab, ignoreIndex, true, what));
  return runVocab({.op = VocabOp::kCrossEntropyForward,
                   .dtype = dtype,
                   .logits = logits,
                   .labels = labels,
                   .out = loss,
                   .lseOut = lse,
                   .vocab = vocab,
                   .ignoreIndex = ignoreIndex},
                  rows, what);
}

int crossEntropyBackward(loom_dtype dtype, const void* logits, const int64_t* labels, const float* lse,
                         const float* dloss, void* dlogits, int64_t rows, int64_t vocab, int64_t ignoreIndex,
                         void* stream) {
  const char* what = "cross_entropy_backward";
  LOOM_CHECK(checkCall(stream, what));
  LOOM_CHECK(checkPointers(rows > 0, {logits, labels, dloss, dlogits}, what));
  LOOM_CHECK(checkLabels(labels, rows, vocab, ignoreIndex, true, what));
  return runVocab({.op = VocabOp::kCrossEntropyBackward,
                   .dtype = dtype,
                   .logits = logits,
                   .labels = labels,
                   .lseIn = lse,
                   .dloss = dloss,
                   .dlogits = dlogits,
                   .vocab = vocab,
                   .ignoreIndex = ignoreIndex},
                  rows, what);
}

int logprobs(loom_dtype dtype, const void* logits, const int64_t* labels, int64_t rows, int64_t vocab, float* out,
             void* stream) {
  const char* what = "logprobs";
  LOOM_CHECK(checkCall(stream, what));
  LOOM_CHECK(checkPointers(rows > 0, {logits, labels, out}, what));
  LOOM_CHECK(checkLabels(labels, rows, vocab, 0, false, what));
  return runVocab(
      {.op = VocabOp::kLogprobs, .dtype = dtype, .logits = logits, .labels = labels, .out = out, .vocab = vocab}, rows,
      what);
}

int greedyLogprobs(loom_dtype dtype, const void* logits, int64_t rows, int64_t vocab, int64_t* tokens, float* logprobs,
                   void* stream) {
  const char* what = "greedy_logprobs";
  LOOM_CHECK(checkCall(stream, what));
  LOOM_CHECK(checkPointers(rows > 0, {logits, tokens, logprobs}, what));
  return runVocab(
      {.op = VocabOp::kGreedy, .dtype = dtype, .logits = logits, .out = logprobs, .tokensOut = tokens, .vocab = vocab},
      rows, what);
}

int entropy(loom_dtype dtype, const void* logits, int64_t rows, int64_t vocab, float* out, void* stream) {
  LOOM_CHECK(checkCall(stream, "entropy"));
  LOOM_CHECK(checkPointers(rows > 0, {logits, out}, "entropy"));
  return runVocab({.op = VocabOp::kEntropy, .dtype = dtype, .logits = logits, .out = out, .vocab = vocab}, rows,
                  "entropy");
}

int klDivergence(loom_dtype dtype, const void* logitsP, const void* logitsQ, int64_t rows, int64_t vocab, float* out,
                 void* stream) {
  LOOM_CHECK(checkCall(stream, "kl_divergence"));
  LOOM_CHECK(checkPointers(rows > 0, {logitsP, logitsQ, out}, "kl_divergence"));
  return runVocab(
      {.op = VocabOp::kKlDivergence, .dtype = dtype, .logits = logitsP, .logitsQ = logitsQ, .out = out, .vocab = vocab},
      rows, "kl_divergence");
}

int checkOptimizer(const OptimizerTensors& t, int64_t n, bool second, const char* what) {
  LOOM_CHECK(checkDtype(t.paramDtype, what));
  LOOM_CHECK(checkDtype(t.gradDtype, what));
  LOOM_CHECK(checkSizes({n}, what));
  LOOM_CHECK(checkPointers(n > 0, {t.param, t.grad, t.first}, what));
  LOOM_CHECK(checkPointers(n > 0 && second, {t.second}, what));
  return LOOM_KERNEL_OK;
}

// Optimizer ranges: whole cache lines of every stream (16 fp32 / 32 bf16 elements).
constexpr int64_t kOptimizerGrain = 1 << 16;

int adamwStep(const loom_adam_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype, const void* grad,
              float* expAvg, float* expAvgSq, int64_t n, void* stream) {
  const char* what = "adamw_step";
  LOOM_CHECK(checkCall(stream, what));
  if (!c) return fail(LOOM_KERNEL_INVALID_ARGUMENT, "adamw_step: no config");
  if (c->amsgrad)
    return fail(LOOM_KERNEL_UNSUPPORTED,
                "adamw_step: amsgrad is not supported (the plugin keeps no max of exp_avg_sq)");
  if (c->step < 1) return fail(LOOM_KERNEL_INVALID_ARGUMENT, "adamw_step: step counts from 1");
  AdamArgs a{.t = {.paramDtype = paramDtype,
                   .gradDtype = gradDtype,
                   .param = param,
                   .grad = grad,
                   .first = expAvg,
                   .second = expAvgSq}};
  LOOM_CHECK(checkOptimizer(a.t, n, true, what));
  // The scalars as torch.optim.AdamW computes them in double and ATen rounds them to fp32.
  const double t = static_cast<double>(c->step);
  const double bc1 = c->bias_correction ? 1.0 - std::pow(c->beta1, t) : 1.0;
  const double bc2 = c->bias_correction ? 1.0 - std::pow(c->beta2, t) : 1.0;
  a.lerpWeight = static_cast<float>(1.0 - c->beta1);
  a.beta2 = static_cast<float>(c->beta2);
  a.oneMinusBeta2 = static_cast<float>(1.0 - c->beta2);
  a.negStepSize = static_cast<float>(-(c->lr / bc1));
  a.bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  a.eps = static_cast<float>(c->eps);
  a.decay = static_cast<float>(1.0 - c->lr * c->weight_decay);
  a.weightDecay = static_cast<float>(c->weight_decay);
  a.decoupled = c->decoupled_weight_decay != 0;
  a.hasWeightDecay = c->weight_decay != 0.0;
  const IsaKernels* isa = runtime().isa;
  parallelFor(n, kOptimizerGrain, [&](int64_t b, int64_t e) { isa->adam(a, b, e); });
  return LOOM_KERNEL_OK;
}

int lionStep(const loom_lion_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype, const void* grad,
             float* expAvg, int64_t n, void* stream) {
  const char* what = "lion_step";
  LOOM_CHECK(checkCall(stream, what));
  if (!c) return fail(LOOM_KERNEL_INVALID_ARGUMENT, "lion_step: no config");
  LionArgs a{.t = {.paramDtype = paramDtype, .gradDtype = gradDtype, .param = param, .grad = grad, .first = expAvg}};
  LOOM_CHECK(checkOptimizer(a.t, n, false, what));
  a.beta1 = static_cast<float>(c->beta1);
  a.oneMinusBeta1 = static_cast<float>(1.0 - c->beta1);
  a.beta2 = static_cast<float>(c->beta2);
  a.oneMinusBeta2 = static_cast<float>(1.0 - c->beta2);
  a.negLr = static_cast<float>(-c->lr);
  a.decay = static_cast<float>(1.0 - c->lr * c->weight_decay);
  a.hasWeightDecay = c->weight_decay != 0.0;
  const IsaKernels* isa = runtime().isa;
  parallelFor(n, kOptimizerGrain, [&](int64_t b, int64_t e) { isa->lion(a, b, e); });
  return LOOM_KERNEL_OK;
}

int adagradStep(const loom_adagrad_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype,
                const void* grad, float* sum, int64_t n, void* stream) {
  const char* what = "adagrad_step";
  LOOM_CHECK(checkCall(stream, what));
  if (!c) return fail(LOOM_KERNEL_INVALID_ARGUMENT, "adagrad_step: no config");
  AdagradArgs a{.t = {.paramDtype = paramDtype, .gradDtype = gradDtype, .param = param, .grad = grad, .first = sum}};
  LOOM_CHECK(checkOptimizer(a.t, n, false, what));
  a.negLr = static_cast<float>(-c->lr);
  a.eps = static_cast<float>(c->eps);
  a.weightDecay = static_cast<float>(c->weight_decay);
  a.hasWeightDecay = c->weight_decay != 0.0;
  const IsaKernels* isa = runtime().isa;
  parallelFor(n, kOptimizerGrain, [&](int64_t b, int64_t e) { isa->adagrad(a, b, e); });
  return LOOM_KERNEL_OK;
}

int maskedSoftmaxForward(loom_dtype dtype, const void* x, const uint8_t* mask, void* y, int64_t rows, int64_t cols,
                         double scale, void* stream) {
  LOOM_CHECK(checkCall(stream, "masked_softmax_forward"));
  LOOM_CHECK(checkDtype(dtype, "masked_softmax_forward"));
  LOOM_CHECK(checkSizes({rows, cols}, "masked_softmax_forward"));
  LOOM_CHECK(checkPointers(rows * cols > 0, {x, y}, "masked_softmax_forward"));
  const MaskedSoftmaxArgs args{
      .dtype = dtype, .x = x, .mask = mask, .y = nullptr, .dy = nullptr, .out = y, .cols = cols,
      .scale = static_cast<float>(scale)};
  parallelFor(rows, rowGrain(cols), [&](int64_t b, int64_t e) { maskedSoftmaxForwardRows(args, b, e); });
  return LOOM_KERNEL_OK;
}

int maskedSoftmaxBackward(loom_dtype dtype, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols,
                          double scale, void* stream) {
  LOOM_CHECK(checkCall(stream, "masked_softmax_backward"));
  LOOM_CHECK(checkDtype(dtype, "masked_softmax_backward"));
  LOOM_CHECK(checkSizes({rows, cols}, "masked_softmax_backward"));
  LOOM_CHECK(checkPointers(rows * cols > 0, {y, dy, dx}, "masked_softmax_backward"));
  const MaskedSoftmaxArgs args{
      .dtype = dtype, .x = nullptr, .mask = nullptr, .y = y, .dy = dy, .out = dx, .cols = cols,
      .scale = static_cast<float>(scale)};
  parallelFor(rows, rowGrain(cols), [&](int64_t b, int64_t e) { maskedSoftmaxBackwardRows(args, b, e); });
  return LOOM_KERNEL_OK;
}

int clampedSwigluForward(loom_dtype dtype, const void* gate, const void* up, void* out, int64_t n, double alpha,
                         double limit, void* stream) {
  LOOM_CHECK(checkCall(stream, "clamped_swiglu_forward"));
  LOOM_CHECK(checkDtype(dtype, "clamped_swiglu_forward"));
  LOOM_CHECK(checkSizes({n}, "clamped_swiglu_forward"));
  LOOM_CHECK(checkPointers(n > 0, {gate, up, out}, "clamped_swiglu_forward"));
  const ClampedSwigluArgs args{.dtype = dtype, .gate = gate, .up = up, .dout = nullptr, .out = out, .dgate = nullptr,
                               .dup = nullptr, .alpha = static_cast<float>(alpha), .limit = static_cast<float>(limit)};
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) { clampedSwigluForwardRange(args, b, e); });
  return LOOM_KERNEL_OK;
}

int clampedSwigluBackward(loom_dtype dtype, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                          int64_t n, double alpha, double limit, void* stream) {
  LOOM_CHECK(checkCall(stream, "clamped_swiglu_backward"));
  LOOM_CHECK(checkDtype(dtype, "clamped_swiglu_backward"));
  LOOM_CHECK(checkSizes({n}, "clamped_swiglu_backward"));
  LOOM_CHECK(checkPointers(n > 0, {gate, up, dout, dgate, dup}, "clamped_swiglu_backward"));
  const ClampedSwigluArgs args{.dtype = dtype, .gate = gate, .up = up, .dout = dout, .out = nullptr, .dgate = dgate,
                               .dup = dup, .alpha = static_cast<float>(alpha), .limit = static_cast<float>(limit)};
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) { clampedSwigluBackwardRange(args, b, e); });
  return LOOM_KERNEL_OK;
}

int pagedAttentionDecode(loom_dtype dtype, const void* q, const void* keyCache, const void* valueCache,
                         const int64_t* blockTables, const int64_t* contextLens, void* out, int64_t seqs, int64_t heads,
                         int64_t kvHeads, int64_t dim, int64_t blockSize, int64_t maxBlocks, double scale,
                         int64_t window, void* stream) {
  const char* what = "paged_attention_decode";
  LOOM_CHECK(checkCall(stream, what));
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({seqs, heads, kvHeads, dim, blockSize, maxBlocks}, what));
  LOOM_CHECK(checkPointers(seqs > 0, {q, keyCache, valueCache, blockTables, contextLens, out}, what));
  if (kvHeads < 1 || heads % kvHeads != 0 || blockSize < 1 || maxBlocks < 1)
    return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": " + std::to_string(heads) +
                                                  " query heads over " + std::to_string(kvHeads) +
                                                  " KV heads, or an empty block table");
  const PagedDecodeArgs args{.dtype = dtype, .q = q, .keyCache = keyCache, .valueCache = valueCache,
                             .blockTables = blockTables, .contextLens = contextLens, .out = out, .heads = heads,
                             .kvHeads = kvHeads, .dim = dim, .blockSize = blockSize, .maxBlocks = maxBlocks,
                             .window = window, .scale = static_cast<float>(scale)};
  // A row is a query head over its whole context: a few rows a task.
  parallelFor(seqs * heads, 4, [&](int64_t b, int64_t e) { pagedDecodeRows(args, b, e); });
  return LOOM_KERNEL_OK;
}

int ropeKvWrite(loom_dtype dtype, const void* q, const void* k, const void* v, int64_t qStride, int64_t kvStride,
                const void* qNorm, const void* kNorm, double eps, const void* cos, const void* sin,
                const int64_t* slots, void* qOut, void* keyCache, void* valueCache, int64_t tokens, int64_t heads,
                int64_t kvHeads, int64_t dim, void* stream) {
  LOOM_CHECK(checkCall(stream, "rope_kv_write"));
  LOOM_CHECK(checkRopeKvWrite(dtype, {q, k, v, cos, sin, slots, qOut, keyCache, valueCache}, qNorm, kNorm, qStride,
                              kvStride, tokens, heads, kvHeads, dim));
  const RopeKvWriteArgs args{.dtype = dtype, .q = q, .k = k, .v = v, .qStride = qStride, .kvStride = kvStride,
                             .qNorm = qNorm, .kNorm = kNorm, .eps = static_cast<float>(eps), .cos = cos, .sin = sin,
                             .slots = slots, .qOut = qOut, .keyCache = keyCache, .valueCache = valueCache,
                             .heads = heads, .kvHeads = kvHeads, .dim = dim};
  parallelFor(tokens, 1, [&](int64_t b, int64_t e) { ropeKvWriteTokens(args, b, e); });
  return LOOM_KERNEL_OK;
}

loom_kernel_table gTable = {
    .abi_version = LOOM_KERNEL_ABI_VERSION,
    .struct_size = sizeof(loom_kernel_table),
    .name = "loom-cpu",
    .device = "cpu",
    .isa = "uninitialized",
    .init = initPlugin,
    .last_error = lastError,
    .rms_norm_forward = rmsNormForward,
    .rms_norm_backward = rmsNormBackward,
    .rope_forward = ropeForward,
    .rope_backward = ropeBackward,
    .swiglu_forward = swigluForward,
    .swiglu_backward = swigluBackward,
    .cross_entropy_forward = crossEntropyForward,
    .cross_entropy_backward = crossEntropyBackward,
    .logprobs = logprobs,
    .entropy = entropy,
    .kl_divergence = klDivergence,
    .adamw_step = adamwStep,
    .lion_step = lionStep,
    .adagrad_step = adagradStep,
    .masked_softmax_forward = maskedSoftmaxForward,
    .masked_softmax_backward = maskedSoftmaxBackward,
    .clamped_swiglu_forward = clampedSwigluForward,
    .clamped_swiglu_backward = clampedSwigluBackward,
    .paged_attention_decode = pagedAttentionDecode,
    .rope_kv_write = ropeKvWrite,
    .add_rms_norm = addRmsNorm,
    .greedy_logprobs = greedyLogprobs,
};

int initPlugin(const loom_kernel_host* host) {
  std::lock_guard<std::mutex> lock(gInitMutex);
  const char* limit =
      hostField(host, &loom_kernel_host::isa, offsetof(loom_kernel_host, isa), static_cast<const char*>(nullptr));
  if (!limit) limit = std::getenv("LOOM_KERNEL_CPU_ISA");
  const IsaKernels* isa = nullptr;
  if (int rc = pickIsa(limit, &isa); rc != LOOM_KERNEL_OK) return rc;
  int threads = hostField(host, &loom_kernel_host::num_threads, offsetof(loom_kernel_host, num_threads), 0);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  gRuntime.isa = isa;
  gRuntime.hostParallelFor = hostField(host, &loom_kernel_host::parallel_for, offsetof(loom_kernel_host, parallel_for),
                                       decltype(loom_kernel_host::parallel_for){nullptr});
  gRuntime.hostCtx =
      hostField(host, &loom_kernel_host::host_ctx, offsetof(loom_kernel_host, host_ctx), static_cast<void*>(nullptr));
  if (!gRuntime.hostParallelFor && (!gRuntime.pool || gRuntime.pool->threads() != threads)) {
    gRuntime.pool.reset();
    gRuntime.pool = std::make_unique<ThreadPool>(threads);
  }
  gRuntime.threads = threads;
  gTable.isa = isa->name;
  gReady.store(true, std::memory_order_release);
  return LOOM_KERNEL_OK;
}

}  // namespace
}  // namespace loom::kernels::cpu

extern "C" LOOM_KERNEL_EXPORT const loom_kernel_table* loom_kernel_plugin(void) { return &loom::kernels::cpu::gTable; }
