// libloom_kernels_cuda.so: the CUDA kernel plugin. This file is the ABI side: it checks each call
// (before anything is enqueued), turns the ABI's scalars into the kernels' fp32 values, and maps
// launch errors to statuses; the kernels are in the *.cu files beside it.
//
// Every op enqueues on the stream it is given (a cudaStream_t; NULL is the legacy default stream)
// on the current device, and returns without synchronizing. The plugin links the CUDA runtime
// statically and touches no device before the first op, so loading it (a CPU rank reading
// LOOM_KERNEL_PATH's directory) needs neither a GPU nor the toolkit's libraries.
//
// Labels are device memory, so they cannot be checked before the call returns without a sync.
// The kernels check them: a row whose label is outside [0, vocab) (and not ignore_index) gets NaN
// outputs (loss and lse, logprob, or the whole dlogits row), so the mistake shows in the results
// at once, and leaves a record in host memory the device writes into. The process's next call of
// an op that takes labels (cross_entropy_forward / _backward, logprobs) returns
// LOOM_KERNEL_INVALID_ARGUMENT naming the label and row, before it enqueues anything, and clears
// the record. A host that wants the error of a given call synchronizes its stream, then makes a
// call with rows = 0.
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/loom_kernel_abi.h"
#include "kernels/plugin_checks.h"

#ifndef LOOM_CUDA_ISA
#define LOOM_CUDA_ISA "sm_90"
#endif

namespace loom::kernels::gpu {
namespace {

// ---- argument checks (before anything is enqueued), beside kernels/plugin_checks.h's ----

// One block per row: the grid's x dimension bounds the rows of one launch.
int checkRows(int64_t rows, const char* what) {
  if (rows > 0x7fffffff)
    return fail(LOOM_KERNEL_UNSUPPORTED, std::string(what) + ": more than 2^31 - 1 rows in one call");
  return LOOM_KERNEL_OK;
}

// The launches' outcome. A device this build has no code for (an architecture below the ones in
// CMAKE_CUDA_ARCHITECTURES) fails the first launch, before any output is written: that is
// UNSUPPORTED, so the registry passes the call on to the reference.
int launched(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return LOOM_KERNEL_OK;
  const std::string message = std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction)
    return fail(LOOM_KERNEL_UNSUPPORTED, message + " (the plugin is built for " LOOM_CUDA_ISA ")");
  return fail(LOOM_KERNEL_INTERNAL, message);
}

cudaStream_t streamOf(void* stream) { return static_cast<cudaStream_t>(stream); }

// ---- the record of a bad label (see the top of this file and cuda_kernels.h) ----

struct BadLabelRecord {
  unsigned long long* host = nullptr;
  unsigned long long* device = nullptr;
  cudaError_t error = cudaSuccess;
};

// Pinned, mapped and portable host memory: every device writes the record with one store, and
// the host reads it without a copy or a sync. Allocated at the first call that takes labels (a
// CPU-only process that loads the plugin never creates a CUDA context).
const BadLabelRecord& badLabelRecord() {
  static const BadLabelRecord record = [] {
    BadLabelRecord r;
    void* host = nullptr;
    r.error = cudaHostAlloc(&host, sizeof(unsigned long long), cudaHostAllocMapped | cudaHostAllocPortable);
    if (r.error != cudaSuccess) return r;
    r.host = static_cast<unsigned long long*>(host);
    *r.host = 0;
    void* device = nullptr;
    r.error = cudaHostGetDevicePointer(&device, host, 0);
    r.device = static_cast<unsigned long long*>(device);
    return r;
  }();
  return record;
}

const char* vocabOpName(int op) {
  switch (static_cast<VocabOp>(op)) {
    case VocabOp::kCrossEntropyForward:
      return "cross_entropy_forward";
    case VocabOp::kCrossEntropyBackward:
      return "cross_entropy_backward";
    case VocabOp::kLogprobs:
      return "logprobs";
    default:
      return "a vocabulary op";
  }
}

// First in every op that takes labels: the record's allocation, then a bad label an earlier call
// found (the record is cleared as it is reported).
int checkBadLabelRecord(const char* what, unsigned long long** device) {
  const BadLabelRecord& record = badLabelRecord();
  if (record.error != cudaSuccess) {
    cudaGetLastError();
    return fail(LOOM_KERNEL_INTERNAL, std::string(what) + ": allocating the label check's host record: " +
                                          cudaGetErrorString(record.error));
  }
  *device = record.device;
  const uint64_t word = __atomic_exchange_n(record.host, 0ull, __ATOMIC_ACQ_REL);
  if (!(word & kBadLabelSet)) return LOOM_KERNEL_OK;
  const int op = static_cast<int>((word >> 60) & 0x7) - 1;
  const int64_t row = static_cast<int64_t>((word >> 32) & static_cast<uint64_t>(kBadRowMax));
  const int32_t label = static_cast<int32_t>(word & 0xffffffffu);
  return fail(LOOM_KERNEL_INVALID_ARGUMENT,
              std::string(what) + ": an earlier " + vocabOpName(op) + " call on the device had label " +
                  std::to_string(label) + (label == INT32_MIN || label == INT32_MAX ? " (saturated to 32 bits)" : "") +
                  " in row " + (row == kBadRowMax ? ">= " : "") + std::to_string(row) +
                  ", outside the vocabulary (and not its ignore_index); that call wrote NaN in such rows, this "
                  "one wrote nothing (labels are checked on the device: the error reaches the next call)");
}

// ---- ops ----

int rmsNormForward(loom_dtype dtype, const void* x, const void* weight, void* y, float* rstd, int64_t rows, int64_t dim,
                   double eps, void* stream) {
  const char* what = "rms_norm_forward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({rows, dim}, what));
  LOOM_CHECK(checkRows(rows, what));
  LOOM_CHECK(checkPointers(rows * dim > 0, {x, weight, y}, what));
  // dim 0 still runs when rstd is wanted: the mean of no elements is NaN there, as in the reference.
  if (rows == 0 || (dim == 0 && !rstd)) return LOOM_KERNEL_OK;
  return launched(launchRmsNormForward({.dtype = dtype,
                                        .x = x,
                                        .weight = weight,
                                        .y = y,
                                        .rstdOut = rstd,
                                        .rows = rows,
                                        .dim = dim,
                                        .eps = static_cast<float>(eps)},
                                       streamOf(stream)),
                  what);
}

int addRmsNorm(loom_dtype dtype, const void* x, const void* residual, const void* weight, void* sum, void* y,
               int64_t rows, int64_t dim, double eps, void* stream) {
  const char* what = "add_rms_norm";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({rows, dim}, what));
  LOOM_CHECK(checkRows(rows, what));
  LOOM_CHECK(checkPointers(rows * dim > 0, {x, residual, weight, sum, y}, what));
  if (rows == 0 || dim == 0) return LOOM_KERNEL_OK;
  if (dim > addRmsNormMaxDim(dtype))
    return fail(LOOM_KERNEL_UNSUPPORTED, std::string(what) + ": dim " + std::to_string(dim) + " is past the " +
                                             std::to_string(addRmsNormMaxDim(dtype)) + " one block holds");
  return launched(launchAddRmsNorm({.dtype = dtype,
                                    .x = x,
                                    .residual = residual,
                                    .weight = weight,
                                    .sum = sum,
                                    .y = y,
                                    .rows = rows,
                                    .dim = dim,
                                    .eps = static_cast<float>(eps)},
                                   streamOf(stream)),
                  what);
}

int rmsNormBackward(loom_dtype dtype, const void* x, const void* weight, const void* dy, const float* rstd, void* dx,
                    float* dweight, int64_t rows, int64_t dim, double eps, void* stream) {
  const char* what = "rms_norm_backward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({rows, dim}, what));
  LOOM_CHECK(checkPointers(rows * dim > 0, {x, weight, dy, dx}, what));
  LOOM_CHECK(checkPointers(dim > 0, {dweight}, what));
  if (dim == 0) return LOOM_KERNEL_OK;
  if (rows == 0)
    return launched(cudaMemsetAsync(dweight, 0, static_cast<size_t>(dim) * sizeof(float), streamOf(stream)), what);
  const int64_t maxDim = rmsNormBackwardMaxDim();
  if (dim > maxDim)
    return fail(LOOM_KERNEL_UNSUPPORTED, std::string(what) + ": dim " + std::to_string(dim) +
                                             " is over the " + std::to_string(maxDim) +
                                             " a block's shared memory holds for the dweight partial");
  return launched(launchRmsNormBackward({.dtype = dtype,
                                         .x = x,
                                         .weight = weight,
                                         .dy = dy,
                                         .rstdIn = rstd,
                                         .dx = dx,
                                         .dweight = dweight,
                                         .rows = rows,
                                         .dim = dim,
                                         .eps = static_cast<float>(eps)},
                                        streamOf(stream)),
                  what);
}

int ropeRun(bool backward, loom_dtype dtype, void* q, void* k, const void* cos, const void* sin, int64_t batch,
            int64_t qHeads, int64_t kHeads, int64_t seq, int64_t headDim, int64_t cosBatchStride, void* stream) {
  const char* what = backward ? "rope_backward" : "rope_forward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({batch, qHeads, kHeads, seq, headDim, cosBatchStride}, what));
  if (headDim % 2 != 0) return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": head_dim must be even");
  const int64_t qRows = batch * qHeads * seq, kRows = batch * kHeads * seq;
  LOOM_CHECK(checkPointers(qRows > 0, {q}, what));
  LOOM_CHECK(checkPointers(kRows > 0, {k}, what));
  LOOM_CHECK(checkPointers(qRows + kRows > 0 && headDim > 0, {cos, sin}, what));
  if (qRows + kRows == 0 || headDim == 0) return LOOM_KERNEL_OK;
  return launched(launchRope({.dtype = dtype,
                              .q = q,
                              .k = k,
                              .cos = cos,
                              .sin = sin,
                              .qRows = qRows,
                              .kRows = kRows,
                              .qHeads = qHeads,
                              .kHeads = kHeads,
                              .seq = seq,
                              .headDim = headDim,
                              .cosBatchStride = cosBatchStride,
                              .backward = backward},
                             streamOf(stream)),
                  what);
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
  const char* what = "swiglu_forward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({n}, what));
  LOOM_CHECK(checkPointers(n > 0, {gate, up, out}, what));
  if (n == 0) return LOOM_KERNEL_OK;
  return launched(
      launchSwigluForward({.dtype = dtype, .gate = gate, .up = up, .out = out, .n = n}, streamOf(stream)), what);
}

int swigluBackward(loom_dtype dtype, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                   int64_t n, void* stream) {
  const char* what = "swiglu_backward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({n}, what));
  LOOM_CHECK(checkPointers(n > 0, {gate, up, dout, dgate, dup}, what));
  if (n == 0) return LOOM_KERNEL_OK;
  return launched(
      launchSwigluBackward(
          {.dtype = dtype, .gate = gate, .up = up, .dout = dout, .dgate = dgate, .dup = dup, .n = n},
          streamOf(stream)),
      what);
}

int clampedSwigluForward(loom_dtype dtype, const void* gate, const void* up, void* out, int64_t n, double alpha,
                         double limit, void* stream) {
  const char* what = "clamped_swiglu_forward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({n}, what));
  LOOM_CHECK(checkPointers(n > 0, {gate, up, out}, what));
  if (n == 0) return LOOM_KERNEL_OK;
  const ClampedSwigluArgs a{.tensors = {.dtype = dtype, .gate = gate, .up = up, .out = out, .n = n},
                            .alpha = static_cast<float>(alpha),
                            .limit = static_cast<float>(limit),
                            .backward = false};
  return launched(launchClampedSwiglu(a, streamOf(stream)), what);
}

int clampedSwigluBackward(loom_dtype dtype, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                          int64_t n, double alpha, double limit, void* stream) {
  const char* what = "clamped_swiglu_backward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({n}, what));
  LOOM_CHECK(checkPointers(n > 0, {gate, up, dout, dgate, dup}, what));
  if (n == 0) return LOOM_KERNEL_OK;
  const ClampedSwigluArgs a{
      .tensors = {.dtype = dtype, .gate = gate, .up = up, .dout = dout, .dgate = dgate, .dup = dup, .n = n},
      .alpha = static_cast<float>(alpha),
      .limit = static_cast<float>(limit),
      .backward = true};
  return launched(launchClampedSwiglu(a, streamOf(stream)), what);
}

int maskedSoftmaxForward(loom_dtype dtype, const void* x, const uint8_t* mask, void* y, int64_t rows, int64_t cols,
                         double scale, void* stream) {
  const char* what = "masked_softmax_forward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({rows, cols}, what));
  LOOM_CHECK(checkPointers(rows * cols > 0, {x, y}, what));
  if (rows * cols == 0) return LOOM_KERNEL_OK;
  const MaskedSoftmaxArgs a{.dtype = dtype, .x = x, .mask = mask, .y = nullptr, .dy = nullptr, .out = y,
                            .rows = rows, .cols = cols, .scale = static_cast<float>(scale), .backward = false};
  return launched(launchMaskedSoftmax(a, streamOf(stream)), what);
}

int maskedSoftmaxBackward(loom_dtype dtype, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols,
                          double scale, void* stream) {
  const char* what = "masked_softmax_backward";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({rows, cols}, what));
  LOOM_CHECK(checkPointers(rows * cols > 0, {y, dy, dx}, what));
  if (rows * cols == 0) return LOOM_KERNEL_OK;
  const MaskedSoftmaxArgs a{.dtype = dtype, .x = nullptr, .mask = nullptr, .y = y, .dy = dy, .out = dx,
                            .rows = rows, .cols = cols, .scale = static_cast<float>(scale), .backward = true};
  return launched(launchMaskedSoftmax(a, streamOf(stream)), what);
}

int runVocab(const VocabArgs& args, void* stream, const char* what) {
  LOOM_CHECK(checkDtype(args.dtype, what));
  LOOM_CHECK(checkSizes({args.rows, args.vocab}, what));
  LOOM_CHECK(checkRows(args.rows, what));
  if (args.rows > 0 && args.vocab == 0) return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": vocab is 0");
  if (args.rows == 0) return LOOM_KERNEL_OK;
  return launched(launchVocab(args, streamOf(stream)), what);
}

int crossEntropyForward(loom_dtype dtype, const void* logits, const int64_t* labels, int64_t rows, int64_t vocab,
                        int64_t ignoreIndex, float* loss, float* lse, void* stream) {
  const char* what = "cross_entropy_forward";
  unsigned long long* badLabel = nullptr;
  LOOM_CHECK(checkBadLabelRecord(what, &badLabel));
  LOOM_CHECK(checkPointers(rows > 0, {logits, labels, loss}, what));
  return runVocab({.op = VocabOp::kCrossEntropyForward,
                   .dtype = dtype,
                   .logits = logits,
                   .labels = labels,
                   .out = loss,
                   .lseOut = lse,
                   .rows = rows,
                   .vocab = vocab,
                   .ignoreIndex = ignoreIndex,
                   .ignoring = true,
                   .badLabel = badLabel},
                  stream, what);
}

int crossEntropyBackward(loom_dtype dtype, const void* logits, const int64_t* labels, const float* lse,
                         const float* dloss, void* dlogits, int64_t rows, int64_t vocab, int64_t ignoreIndex,
                         void* stream) {
  const char* what = "cross_entropy_backward";
  unsigned long long* badLabel = nullptr;
  LOOM_CHECK(checkBadLabelRecord(what, &badLabel));
  LOOM_CHECK(checkPointers(rows > 0, {logits, labels, dloss, dlogits}, what));
  return runVocab({.op = VocabOp::kCrossEntropyBackward,
                   .dtype = dtype,
                   .logits = logits,
                   .labels = labels,
                   .lseIn = lse,
                   .dloss = dloss,
                   .dlogits = dlogits,
                   .rows = rows,
                   .vocab = vocab,
                   .ignoreIndex = ignoreIndex,
                   .ignoring = true,
                   .badLabel = badLabel},
                  stream, what);
}

int logprobs(loom_dtype dtype, const void* logits, const int64_t* labels, int64_t rows, int64_t vocab, float* out,
             void* stream) {
  const char* what = "logprobs";
  unsigned long long* badLabel = nullptr;
  LOOM_CHECK(checkBadLabelRecord(what, &badLabel));
  LOOM_CHECK(checkPointers(rows > 0, {logits, labels, out}, what));
  return runVocab({.op = VocabOp::kLogprobs,
                   .dtype = dtype,
                   .logits = logits,
                   .labels = labels,
                   .out = out,
                   .rows = rows,
                   .vocab = vocab,
                   .ignoring = false,
                   .badLabel = badLabel},
                  stream, what);
}

int greedyLogprobs(loom_dtype dtype, const void* logits, int64_t rows, int64_t vocab, int64_t* tokens, float* logprobs,
                   void* stream) {
  const char* what = "greedy_logprobs";
  LOOM_CHECK(checkPointers(rows > 0, {logits, tokens, logprobs}, what));
  // The argmax travels through the block's reductions as an int.
  if (vocab > INT_MAX) return fail(LOOM_KERNEL_UNSUPPORTED, std::string(what) + ": a vocabulary past 2^31 - 1");
  return runVocab({.op = VocabOp::kGreedy,
                   .dtype = dtype,
                   .logits = logits,
                   .out = logprobs,
                   .tokensOut = tokens,
                   .rows = rows,
                   .vocab = vocab},
                  stream, what);
}

int entropy(loom_dtype dtype, const void* logits, int64_t rows, int64_t vocab, float* out, void* stream) {
  LOOM_CHECK(checkPointers(rows > 0, {logits, out}, "entropy"));
  return runVocab(
      {.op = VocabOp::kEntropy, .dtype = dtype, .logits = logits, .out = out, .rows = rows, .vocab = vocab}, stream,
      "entropy");
}

int klDivergence(loom_dtype dtype, const void* logitsP, const void* logitsQ, int64_t rows, int64_t vocab, float* out,
                 void* stream) {
  LOOM_CHECK(checkPointers(rows > 0, {logitsP, logitsQ, out}, "kl_divergence"));
  return runVocab({.op = VocabOp::kKlDivergence,
                   .dtype = dtype,
                   .logits = logitsP,
                   .logitsQ = logitsQ,
                   .out = out,
                   .rows = rows,
                   .vocab = vocab},
                  stream, "kl_divergence");
}

int checkOptimizer(const OptimizerTensors& t, bool second, const char* what) {
  LOOM_CHECK(checkDtype(t.paramDtype, what));
  LOOM_CHECK(checkDtype(t.gradDtype, what));
  LOOM_CHECK(checkSizes({t.n}, what));
  LOOM_CHECK(checkPointers(t.n > 0, {t.param, t.grad, t.first}, what));
  LOOM_CHECK(checkPointers(t.n > 0 && second, {t.second}, what));
  return LOOM_KERNEL_OK;
}

int adamwStep(const loom_adam_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype, const void* grad,
              float* expAvg, float* expAvgSq, int64_t n, void* stream) {
  const char* what = "adamw_step";
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
                   .second = expAvgSq,
                   .n = n}};
  LOOM_CHECK(checkOptimizer(a.t, true, what));
  if (n == 0) return LOOM_KERNEL_OK;
  // The scalars as torch.optim.AdamW computes them in double and ATen rounds them to fp32.
  const double t = static_cast<double>(c->step);
  const double bc1 = c->bias_correction ? 1.0 - std::pow(c->beta1, t) : 1.0;
  const double bc2 = c->bias_correction ? 1.0 - std::pow(c->beta2, t) : 1.0;
  a.lerpWeight = static_cast<float>(1.0 - c->beta1);
  a.beta2 = static_cast<float>(c->beta2);
  a.oneMinusBeta2 = static_cast<float>(1.0 - c->beta2);
  a.negStepSize = static_cast<float>(-(c->lr / bc1));
  a.invBc2Sqrt = 1.0f / static_cast<float>(std::sqrt(bc2));
  a.eps = static_cast<float>(c->eps);
  a.decay = static_cast<float>(1.0 - c->lr * c->weight_decay);
  a.weightDecay = static_cast<float>(c->weight_decay);
  a.decoupled = c->decoupled_weight_decay != 0;
  a.hasWeightDecay = c->weight_decay != 0.0;
  return launched(launchAdam(a, streamOf(stream)), what);
}

int lionStep(const loom_lion_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype, const void* grad,
             float* expAvg, int64_t n, void* stream) {
  const char* what = "lion_step";
  if (!c) return fail(LOOM_KERNEL_INVALID_ARGUMENT, "lion_step: no config");
  LionArgs a{
      .t = {.paramDtype = paramDtype, .gradDtype = gradDtype, .param = param, .grad = grad, .first = expAvg, .n = n}};
  LOOM_CHECK(checkOptimizer(a.t, false, what));
  if (n == 0) return LOOM_KERNEL_OK;
  a.beta1 = static_cast<float>(c->beta1);
  a.oneMinusBeta1 = static_cast<float>(1.0 - c->beta1);
  a.beta2 = static_cast<float>(c->beta2);
  a.oneMinusBeta2 = static_cast<float>(1.0 - c->beta2);
  a.negLr = static_cast<float>(-c->lr);
  a.decay = static_cast<float>(1.0 - c->lr * c->weight_decay);
  a.hasWeightDecay = c->weight_decay != 0.0;
  return launched(launchLion(a, streamOf(stream)), what);
}

int adagradStep(const loom_adagrad_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype,
                const void* grad, float* sum, int64_t n, void* stream) {
  const char* what = "adagrad_step";
  if (!c) return fail(LOOM_KERNEL_INVALID_ARGUMENT, "adagrad_step: no config");
  AdagradArgs a{
      .t = {.paramDtype = paramDtype, .gradDtype = gradDtype, .param = param, .grad = grad, .first = sum, .n = n}};
  LOOM_CHECK(checkOptimizer(a.t, false, what));
  if (n == 0) return LOOM_KERNEL_OK;
  a.negLr = static_cast<float>(-c->lr);
  a.eps = static_cast<float>(c->eps);
  a.weightDecay = static_cast<float>(c->weight_decay);
  a.hasWeightDecay = c->weight_decay != 0.0;
  return launched(launchAdagrad(a, streamOf(stream)), what);
}

int pagedAttentionDecode(loom_dtype dtype, const void* q, const void* keyCache, const void* valueCache,
                         const int64_t* blockTables, const int64_t* contextLens, void* out, int64_t seqs, int64_t heads,
                         int64_t kvHeads, int64_t dim, int64_t blockSize, int64_t maxBlocks, double scale,
                         int64_t window, void* stream) {
  const char* what = "paged_attention_decode";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({seqs, heads, kvHeads, dim, blockSize, maxBlocks}, what));
  LOOM_CHECK(checkPointers(seqs > 0, {q, keyCache, valueCache, blockTables, contextLens, out}, what));
  if (!pagedDecodeSupported(heads, kvHeads, dim))
    return fail(LOOM_KERNEL_UNSUPPORTED, std::string(what) + ": built for head_dim 32, 64 or 128 and 1, 2, 4 or 8 "
                                             "query heads per KV head, got head_dim " + std::to_string(dim) + ", " +
                                             std::to_string(heads) + " heads over " + std::to_string(kvHeads));
  if (blockSize < 1 || maxBlocks < 1) return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": empty block table");
  LOOM_CHECK(checkRows(seqs, what));
  if (seqs == 0) return LOOM_KERNEL_OK;
  const PagedDecodeArgs a{.dtype = dtype,
                          .q = q,
                          .keyCache = keyCache,
                          .valueCache = valueCache,
                          .blockTables = blockTables,
                          .contextLens = contextLens,
                          .out = out,
                          .seqs = seqs,
                          .heads = heads,
                          .kvHeads = kvHeads,
                          .dim = dim,
                          .blockSize = blockSize,
                          .maxBlocks = maxBlocks,
                          .window = window,
                          .scale = static_cast<float>(scale)};
  return launched(launchPagedAttentionDecode(a, streamOf(stream)), what);
}

int ropeKvWrite(loom_dtype dtype, const void* q, const void* k, const void* v, int64_t qStride, int64_t kvStride,
                const void* qNorm, const void* kNorm, double eps, const void* cos, const void* sin,
                const int64_t* slots, void* qOut, void* keyCache, void* valueCache, int64_t tokens, int64_t heads,
                int64_t kvHeads, int64_t dim, void* stream) {
  const char* what = "rope_kv_write";
  LOOM_CHECK(checkRopeKvWrite(dtype, {q, k, v, cos, sin, slots, qOut, keyCache, valueCache}, qNorm, kNorm, qStride,
                              kvStride, tokens, heads, kvHeads, dim));
  const int64_t rows = tokens * (heads + 2 * kvHeads);
  if (rows == 0 || dim == 0) return LOOM_KERNEL_OK;
  // A block takes at least 8 rows (a row's lanes are at most 32 of its 256 threads).
  LOOM_CHECK(checkRows(rows / 8, what));
  return launched(launchRopeKvWrite({.dtype = dtype,
                                     .q = q,
                                     .k = k,
                                     .v = v,
                                     .qStride = qStride,
                                     .kvStride = kvStride,
                                     .qNorm = qNorm,
                                     .kNorm = kNorm,
                                     .eps = static_cast<float>(eps),
                                     .cos = cos,
                                     .sin = sin,
                                     .slots = slots,
                                     .qOut = qOut,
                                     .keyCache = keyCache,
                                     .valueCache = valueCache,
                                     .tokens = tokens,
                                     .heads = heads,
                                     .kvHeads = kvHeads,
                                     .dim = dim},
                                    streamOf(stream)),
                  what);
}

// No init: nothing to configure, and the plugin must load on machines without a GPU.
const loom_kernel_table kTable = {
    .abi_version = LOOM_KERNEL_ABI_VERSION,
    .struct_size = sizeof(loom_kernel_table),
    .name = "loom-cuda",
    .device = "cuda",
    .isa = LOOM_CUDA_ISA,
    .init = nullptr,
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

}  // namespace
}  // namespace loom::kernels::gpu

extern "C" LOOM_KERNEL_EXPORT const loom_kernel_table* loom_kernel_plugin(void) { return &loom::kernels::gpu::kTable; }
