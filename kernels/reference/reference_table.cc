#include "kernels/reference/reference_table.h"

#include <ATen/ATen.h>

#include <string>

#include "kernels/reference/reference_ops.h"

namespace loom::kernels::reference {
namespace {

thread_local std::string tLastError;

at::ScalarType scalarType(loom_dtype dtype) { return dtype == LOOM_DTYPE_BF16 ? at::kBFloat16 : at::kFloat; }

// A tensor over memory the caller owns (inputs are not written).
at::Tensor view(const void* data, loom_dtype dtype, at::IntArrayRef sizes) {
  return at::from_blob(const_cast<void*>(data), sizes, at::TensorOptions().dtype(scalarType(dtype)));
}
at::Tensor viewF32(const float* data, at::IntArrayRef sizes) { return view(data, LOOM_DTYPE_F32, sizes); }
at::Tensor viewLabels(const int64_t* data, int64_t rows) {
  return at::from_blob(const_cast<int64_t*>(data), {rows}, at::TensorOptions().dtype(at::kLong));
}

// Runs body, turning what it throws into a status and the thread's last error.
template <typename Body>
int guarded(loom_dtype dtype, void* stream, Body&& body) {
  if (dtype != LOOM_DTYPE_F32 && dtype != LOOM_DTYPE_BF16) {
    tLastError = "dtype " + std::to_string(dtype) + " is neither fp32 nor bf16";
    return LOOM_KERNEL_UNSUPPORTED;
  }
  if (stream) {
    tLastError = "a stream was given to the cpu reference";
    return LOOM_KERNEL_INVALID_ARGUMENT;
  }
  try {
    body();
    return LOOM_KERNEL_OK;
  } catch (const c10::Error& e) {
    tLastError = e.what_without_backtrace();
  } catch (const std::exception& e) {
    tLastError = e.what();
  }
  return LOOM_KERNEL_INTERNAL;
}

int rmsNormForward(loom_dtype dtype, const void* x, const void* weight, void* y, float* rstd, int64_t rows, int64_t dim,
                   double eps, void* stream) {
  return guarded(dtype, stream, [&] {
    const at::Tensor xt = view(x, dtype, {rows, dim});
    view(y, dtype, {rows, dim}).copy_(reference::rmsNormForward(xt, view(weight, dtype, {dim}), eps));
    if (rstd) viewF32(rstd, {rows}).copy_(rmsNormRstd(xt, eps));
  });
}

int rmsNormBackward(loom_dtype dtype, const void* x, const void* weight, const void* dy, const float* /*rstd*/,
                    void* dx, float* dweight, int64_t rows, int64_t dim, double eps, void* stream) {
  return guarded(dtype, stream, [&] {
    auto [gx, gw] = reference::rmsNormBackward(view(x, dtype, {rows, dim}), view(weight, dtype, {dim}),
                                               view(dy, dtype, {rows, dim}), eps);
    view(dx, dtype, {rows, dim}).copy_(gx);
    viewF32(dweight, {dim}).copy_(gw);
  });
}

int rope(bool backward, loom_dtype dtype, void* q, void* k, const void* cos, const void* sin, int64_t batch,
         int64_t qHeads, int64_t kHeads, int64_t seq, int64_t headDim, int64_t cosBatchStride, void* stream) {
  return guarded(dtype, stream, [&] {
    TORCH_CHECK(headDim % 2 == 0, "head_dim must be even");
    at::Tensor qt = q ? view(q, dtype, {batch, qHeads, seq, headDim})
                      : at::empty({batch, 0, seq, headDim}, at::TensorOptions().dtype(scalarType(dtype)));
    at::Tensor kt = k ? view(k, dtype, {batch, kHeads, seq, headDim})
                      : at::empty({batch, 0, seq, headDim}, at::TensorOptions().dtype(scalarType(dtype)));
    at::Tensor c, s;
    if (cosBatchStride == 0) {
      c = view(cos, dtype, {seq, headDim});
      s = view(sin, dtype, {seq, headDim});
    } else {
      c = at::from_blob(const_cast<void*>(cos), {batch, seq, headDim}, {cosBatchStride, headDim, 1},
                        at::TensorOptions().dtype(scalarType(dtype)));
      s = at::from_blob(const_cast<void*>(sin), {batch, seq, headDim}, {cosBatchStride, headDim, 1},
                        at::TensorOptions().dtype(scalarType(dtype)));
    }
    auto [oq, ok] = backward ? ropeBackward(qt, kt, c, s) : ropeForward(qt, kt, c, s);
    if (q) view(q, dtype, {batch, qHeads, seq, headDim}).copy_(oq);
    if (k) view(k, dtype, {batch, kHeads, seq, headDim}).copy_(ok);
  });
}

int ropeForwardSlot(loom_dtype dtype, void* q, void* k, const void* cos, const void* sin, int64_t batch, int64_t qHeads,
                    int64_t kHeads, int64_t seq, int64_t headDim, int64_t cosBatchStride, void* stream) {
  return rope(false, dtype, q, k, cos, sin, batch, qHeads, kHeads, seq, headDim, cosBatchStride, stream);
}
int ropeBackwardSlot(loom_dtype dtype, void* dq, void* dk, const void* cos, const void* sin, int64_t batch,
                     int64_t qHeads, int64_t kHeads, int64_t seq, int64_t headDim, int64_t cosBatchStride,
                     void* stream) {
  return rope(true, dtype, dq, dk, cos, sin, batch, qHeads, kHeads, seq, headDim, cosBatchStride, stream);
}

int swigluForward(loom_dtype dtype, const void* gate, const void* up, void* out, int64_t n, void* stream) {
  return guarded(dtype, stream, [&] {
    view(out, dtype, {n}).copy_(reference::swigluForward(view(gate, dtype, {n}), view(up, dtype, {n})));
  });
}

int swigluBackward(loom_dtype dtype, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                   int64_t n, void* stream) {
  return guarded(dtype, stream, [&] {
    auto [gg, gu] = reference::swigluBackward(view(gate, dtype, {n}), view(up, dtype, {n}), view(dout, dtype, {n}));
    view(dgate, dtype, {n}).copy_(gg);
    view(dup, dtype, {n}).copy_(gu);
  });
}

int maskedSoftmaxForward(loom_dtype dtype, const void* x, const uint8_t* mask, void* y, int64_t rows, int64_t cols,
                         double scale, void* stream) {
  return guarded(dtype, stream, [&] {
    const at::Tensor m =
        mask ? at::from_blob(const_cast<uint8_t*>(mask), {rows, cols}, at::TensorOptions().dtype(at::kByte)).to(at::kBool)
             : at::Tensor();
    view(y, dtype, {rows, cols}).copy_(reference::maskedSoftmaxForward(view(x, dtype, {rows, cols}), m, scale));
  });
}

int maskedSoftmaxBackward(loom_dtype dtype, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols,
                          double scale, void* stream) {
  return guarded(dtype, stream, [&] {
    view(dx, dtype, {rows, cols})
        .copy_(reference::maskedSoftmaxBackward(view(y, dtype, {rows, cols}), view(dy, dtype, {rows, cols}), scale));
  });
}

int clampedSwigluForward(loom_dtype dtype, const void* gate, const void* up, void* out, int64_t n, double alpha,
                         double limit, void* stream) {
  return guarded(dtype, stream, [&] {
    view(out, dtype, {n}).copy_(
        reference::clampedSwigluForward(view(gate, dtype, {n}), view(up, dtype, {n}), alpha, limit));
  });
}

int clampedSwigluBackward(loom_dtype dtype, const void* gate, const void* up, const void* dout, void* dgate, void* dup,
                          int64_t n, double alpha, double limit, void* stream) {
  return guarded(dtype, stream, [&] {
    auto [gg, gu] = reference::clampedSwigluBackward(view(gate, dtype, {n}), view(up, dtype, {n}),
                                                     view(dout, dtype, {n}), alpha, limit);
    view(dgate, dtype, {n}).copy_(gg);
    view(dup, dtype, {n}).copy_(gu);
  });
}

int crossEntropyForward(loom_dtype dtype, const void* logits, const int64_t* labels, int64_t rows, int64_t vocab,
                        int64_t ignoreIndex, float* loss, float* lse, void* stream) {
  return guarded(dtype, stream, [&] {
    auto out =
        reference::crossEntropyForward(view(logits, dtype, {rows, vocab}), viewLabels(labels, rows), ignoreIndex);
    viewF32(loss, {rows}).copy_(out.loss);
    if (lse) viewF32(lse, {rows}).copy_(out.lse);
  });
}

int crossEntropyBackward(loom_dtype dtype, const void* logits, const int64_t* labels, const float* /*lse*/,
                         const float* dloss, void* dlogits, int64_t rows, int64_t vocab, int64_t ignoreIndex,
                         void* stream) {
  return guarded(dtype, stream, [&] {
    view(dlogits, dtype, {rows, vocab})
        .copy_(reference::crossEntropyBackward(view(logits, dtype, {rows, vocab}), viewLabels(labels, rows),
                                               viewF32(dloss, {rows}), ignoreIndex));
  });
}

int logprobsSlot(loom_dtype dtype, const void* logits, const int64_t* labels, int64_t rows, int64_t vocab, float* out,
                 void* stream) {
  return guarded(dtype, stream, [&] {
    viewF32(out, {rows}).copy_(logprobs(view(logits, dtype, {rows, vocab}), viewLabels(labels, rows)));
  });
}

int entropySlot(loom_dtype dtype, const void* logits, int64_t rows, int64_t vocab, float* out, void* stream) {
  return guarded(dtype, stream, [&] { viewF32(out, {rows}).copy_(entropy(view(logits, dtype, {rows, vocab}))); });
}

int klSlot(loom_dtype dtype, const void* p, const void* q, int64_t rows, int64_t vocab, float* out, void* stream) {
  return guarded(dtype, stream, [&] {
    viewF32(out, {rows}).copy_(klDivergence(view(p, dtype, {rows, vocab}), view(q, dtype, {rows, vocab})));
  });
}

// Optimizer slots: the param's dtype is checked by guarded(); the grad's here.
int checkGrad(loom_dtype gradDtype) {
  if (gradDtype == LOOM_DTYPE_F32 || gradDtype == LOOM_DTYPE_BF16) return LOOM_KERNEL_OK;
  tLastError = "grad dtype " + std::to_string(gradDtype) + " is neither fp32 nor bf16";
  return LOOM_KERNEL_UNSUPPORTED;
}

int adamwStep(const loom_adam_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype, const void* grad,
              float* expAvg, float* expAvgSq, int64_t n, void* stream) {
  if (c && c->amsgrad) {
    tLastError = "amsgrad is not supported";
    return LOOM_KERNEL_UNSUPPORTED;
  }
  if (int rc = checkGrad(gradDtype); rc != LOOM_KERNEL_OK) return rc;
  return guarded(paramDtype, stream, [&] {
    TORCH_CHECK(c, "no config");
    adamStep(*c, view(param, paramDtype, {n}), view(grad, gradDtype, {n}), viewF32(expAvg, {n}),
             viewF32(expAvgSq, {n}));
  });
}

int lionStepSlot(const loom_lion_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype, const void* grad,
                 float* expAvg, int64_t n, void* stream) {
  if (int rc = checkGrad(gradDtype); rc != LOOM_KERNEL_OK) return rc;
  return guarded(paramDtype, stream, [&] {
    TORCH_CHECK(c, "no config");
    lionStep(*c, view(param, paramDtype, {n}), view(grad, gradDtype, {n}), viewF32(expAvg, {n}));
  });
}

int adagradStepSlot(const loom_adagrad_config* c, loom_dtype paramDtype, void* param, loom_dtype gradDtype,
                    const void* grad, float* sum, int64_t n, void* stream) {
  if (int rc = checkGrad(gradDtype); rc != LOOM_KERNEL_OK) return rc;
  return guarded(paramDtype, stream, [&] {
    TORCH_CHECK(c, "no config");
    adagradStep(*c, view(param, paramDtype, {n}), view(grad, gradDtype, {n}), viewF32(sum, {n}));
  });
}

const char* lastError() { return tLastError.c_str(); }

const loom_kernel_table kTable = {
    .abi_version = LOOM_KERNEL_ABI_VERSION,
    .struct_size = sizeof(loom_kernel_table),
    .name = "reference",
    .device = "cpu",
    .isa = "libtorch",
    .init = nullptr,
    .last_error = lastError,
    .rms_norm_forward = rmsNormForward,
    .rms_norm_backward = rmsNormBackward,
    .rope_forward = ropeForwardSlot,
    .rope_backward = ropeBackwardSlot,
    .swiglu_forward = swigluForward,
    .swiglu_backward = swigluBackward,
    .cross_entropy_forward = crossEntropyForward,
    .cross_entropy_backward = crossEntropyBackward,
    .logprobs = logprobsSlot,
    .entropy = entropySlot,
    .kl_divergence = klSlot,
    .adamw_step = adamwStep,
    .lion_step = lionStepSlot,
    .adagrad_step = adagradStepSlot,
    .masked_softmax_forward = maskedSoftmaxForward,
    .masked_softmax_backward = maskedSoftmaxBackward,
    .clamped_swiglu_forward = clampedSwigluForward,
    .clamped_swiglu_backward = clampedSwigluBackward,
};

}  // namespace

const loom_kernel_table* referenceKernelTable() { return &kTable; }

}  // namespace loom::kernels::reference
