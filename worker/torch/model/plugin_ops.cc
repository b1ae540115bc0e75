#include "worker/torch/model/plugin_ops.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#ifdef LOOM_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "worker/torch/model/ops.h"

namespace loom::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

const kernels::KernelRegistry* gRegistry = nullptr;

// HF's ignore label, as the reference cross entropy uses it.
constexpr int64_t kIgnoreLabel = -100;
// cross_entropy_backward without an ignored label (the backward of logprobs): no label equals it.
constexpr int64_t kNoIgnoredLabel = std::numeric_limits<int64_t>::min();

const char* deviceName(const at::Tensor& t) { return t.is_cuda() ? "cuda" : "cpu"; }

// The stream a plugin runs on: libtorch's current one for the tensor's GPU, none on the host.
void* streamOf(const at::Tensor& t) {
#ifdef LOOM_HAVE_CUDA
  if (t.is_cuda()) return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#endif
  return nullptr;
}

bool pluginDtype(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}
loom_dtype dtypeOf(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32; }

// Whether a plugin takes both slots of an op on `t`'s device.
template <typename Forward, typename Backward>
bool pluginServes(Forward loom_kernel_table::*forward, Backward loom_kernel_table::*backward, const at::Tensor& t) {
  return gRegistry && gRegistry->pluginProvides(forward, deviceName(t)) &&
         gRegistry->pluginProvides(backward, deviceName(t));
}

// Thrown when every implementation refused a call (a plugin built for another GPU, a size it
// does not take): the dispatcher then runs the libtorch reference instead. Refusals come before
// any output is written.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs a slot on `like`'s device (made current: the plugin launches on the current one). A
// failed kernel becomes a c10::Error naming the op (the runtime turns it into the job's reason).
template <typename Fn, typename... Args>
void run(Fn loom_kernel_table::*slot, const at::Tensor& like, Args... args) {
  const c10::DeviceGuard onDevice(like.device());
  const Status status = gRegistry->call(slot, deviceName(like), args...);
  if (status.code() == StatusCode::kUnimplemented) throw Refused(status.message());
  TORCH_CHECK(status.isOk(), status.message());
}

// The plugin's function where it can take the call; else, and when every plugin refuses the
// forward, the reference.
template <typename Plugin, typename Reference>
auto pluginOr(bool usable, Plugin&& plugin, Reference&& reference) {
  if (!usable) return reference();
  try {
    return plugin();
  } catch (const Refused&) {
    return reference();
  }
}

at::Tensor fp32Like(const at::Tensor& like, at::IntArrayRef sizes) {
  return at::empty(sizes, like.options().dtype(at::kFloat));
}

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weightIn, double eps) {
    const at::Tensor x = input.contiguous();
    const at::Tensor weight = weightIn.contiguous();
    const int64_t dim = x.size(-1);
    const int64_t rows = x.numel() / dim;
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = fp32Like(x, {rows});
    run(&loom_kernel_table::rms_norm_forward, x, dtypeOf(x), x.const_data_ptr(), weight.const_data_ptr(),
        y.data_ptr(), rstd.data_ptr<float>(), rows, dim, eps, streamOf(x));
    ctx->save_for_backward({x, weight, rstd});
    ctx->saved_data["eps"] = eps;
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::Tensor dy = grads[0].contiguous();
    const int64_t dim = x.size(-1);
    const double eps = ctx->saved_data["eps"].toDouble();
    at::Tensor dx = at::empty_like(x);
    at::Tensor dweight = fp32Like(x, {dim});
    try {
      run(&loom_kernel_table::rms_norm_backward, x, dtypeOf(x), x.const_data_ptr(), weight.const_data_ptr(),
          dy.const_data_ptr(), rstd.const_data_ptr<float>(), dx.data_ptr(), dweight.data_ptr<float>(),
          x.numel() / dim, dim, eps, streamOf(x));
    } catch (const Refused&) {
      // A backward the plugin does not take (a dim past its shared memory): the reference's
      // gradients, by autograd through its forward.
      at::AutoGradMode enable(true);
      const at::Tensor xl = x.detach().requires_grad_(true), wl = weight.detach().requires_grad_(true);
      auto g = torch::autograd::grad({referenceOps().rmsNorm(xl, wl, eps)}, {xl, wl}, {dy});
      return {g[0], g[1], at::Tensor()};
    }
    return {dx, dweight.to(weight.scalar_type()), at::Tensor()};
  }
};

// q [B, H, S, D] and k [B, Hkv, S, D] (any strides) rotated into fresh contiguous tensors:
// the slots work in place, and the inputs are not theirs to change.
void ropeInPlace(bool backward, at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  // [1, S, D] is one table for every sequence, as [S, D] is.
  const int64_t cosBatchStride = cos.dim() == 3 && cos.size(0) > 1 ? cos.stride(0) : 0;
  auto slot = backward ? &loom_kernel_table::rope_backward : &loom_kernel_table::rope_forward;
  run(slot, q, dtypeOf(q), q.data_ptr(), k.data_ptr(), cos.const_data_ptr(), sin.const_data_ptr(), q.size(0),
      q.size(1), k.size(1), q.size(2), q.size(3), cosBatchStride, streamOf(q));
}

struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cosIn,
                             const at::Tensor& sinIn) {
    at::Tensor qOut = q.clone(at::MemoryFormat::Contiguous);
    at::Tensor kOut = k.clone(at::MemoryFormat::Contiguous);
    const at::Tensor cos = cosIn.contiguous();
    const at::Tensor sin = sinIn.contiguous();
    ropeInPlace(/*backward=*/false, qOut, kOut, cos, sin);
    ctx->save_for_backward({cos, sin});
    return {qOut, kOut};
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor dq = grads[0].clone(at::MemoryFormat::Contiguous);
    at::Tensor dk = grads[1].clone(at::MemoryFormat::Contiguous);
    ropeInPlace(/*backward=*/true, dq, dk, saved[0], saved[1]);
    return {dq, dk, at::Tensor(), at::Tensor()};
  }
};

struct SwigluFunction : public torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gateIn, const at::Tensor& upIn) {
    const at::Tensor gate = gateIn.contiguous();
    const at::Tensor up = upIn.contiguous();
    at::Tensor out = at::empty_like(gate);
    run(&loom_kernel_table::swiglu_forward, gate, dtypeOf(gate), gate.const_data_ptr(), up.const_data_ptr(),
        out.data_ptr(), gate.numel(), streamOf(gate));
    ctx->save_for_backward({gate, up});
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1];
    const at::Tensor dout = grads[0].contiguous();
    at::Tensor dgate = at::empty_like(gate);
    at::Tensor dup = at::empty_like(up);
    run(&loom_kernel_table::swiglu_backward, gate, dtypeOf(gate), gate.const_data_ptr(), up.const_data_ptr(),
        dout.const_data_ptr(), dgate.data_ptr(), dup.data_ptr(), gate.numel(), streamOf(gate));
    return {dgate, dup};
  }
};

struct ClampedSwigluFunction : public torch::autograd::Function<ClampedSwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gateIn, const at::Tensor& upIn, double alpha,
                            double limit) {
    const at::Tensor gate = gateIn.contiguous();
    const at::Tensor up = upIn.contiguous();
    at::Tensor out = at::empty_like(gate);
    run(&loom_kernel_table::clamped_swiglu_forward, gate, dtypeOf(gate), gate.const_data_ptr(), up.const_data_ptr(),
        out.data_ptr(), gate.numel(), alpha, limit, streamOf(gate));
    ctx->save_for_backward({gate, up});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["limit"] = limit;
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1];
    const at::Tensor dout = grads[0].contiguous();
    at::Tensor dgate = at::empty_like(gate);
    at::Tensor dup = at::empty_like(up);
    run(&loom_kernel_table::clamped_swiglu_backward, gate, dtypeOf(gate), gate.const_data_ptr(), up.const_data_ptr(),
        dout.const_data_ptr(), dgate.data_ptr(), dup.data_ptr(), gate.numel(), ctx->saved_data["alpha"].toDouble(),
        ctx->saved_data["limit"].toDouble(), streamOf(gate));
    return {dgate, dup, at::Tensor(), at::Tensor()};
  }
};

// The mean over the rows whose label is not ignored. The count stays a tensor: reading it on the
// host would wait for the GPU.
struct CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logitsIn, const at::Tensor& labelsIn) {
    const at::Tensor logits = logitsIn.contiguous();
    const at::Tensor labels = labelsIn.to(at::kLong).contiguous();
    const int64_t rows = logits.size(0);
    at::Tensor losses = fp32Like(logits, {rows});
    at::Tensor lse = fp32Like(logits, {rows});
    run(&loom_kernel_table::cross_entropy_forward, logits, dtypeOf(logits), logits.const_data_ptr(),
        labels.const_data_ptr<int64_t>(), rows, logits.size(1), kIgnoreLabel, losses.data_ptr<float>(),
        lse.data_ptr<float>(), streamOf(logits));
    at::Tensor counted = labels.ne(kIgnoreLabel).sum().to(at::kFloat);
    ctx->save_for_backward({logits, labels, lse, counted});
    return losses.sum() / counted;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &labels = saved[1], &lse = saved[2], &counted = saved[3];
    const int64_t rows = logits.size(0);
    const at::Tensor dloss = (grads[0].to(at::kFloat) / counted).expand({rows}).contiguous();
    at::Tensor dlogits = at::empty_like(logits);
    run(&loom_kernel_table::cross_entropy_backward, logits, dtypeOf(logits), logits.const_data_ptr(),
        labels.const_data_ptr<int64_t>(), lse.const_data_ptr<float>(), dloss.const_data_ptr<float>(),
        dlogits.data_ptr(), rows, logits.size(1), kIgnoreLabel, streamOf(logits));
    return {dlogits, at::Tensor()};
  }
};

// log p(label) per row; its backward is the cross entropy's with the sign turned.
struct LogprobsFunction : public torch::autograd::Function<LogprobsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logitsIn, const at::Tensor& labelsIn) {
    const at::Tensor logits = logitsIn.contiguous();
    const at::Tensor labels = labelsIn.to(at::kLong).contiguous();
    const int64_t rows = logits.size(0);
    at::Tensor out = fp32Like(logits, {rows});
    run(&loom_kernel_table::logprobs, logits, dtypeOf(logits), logits.const_data_ptr(),
        labels.const_data_ptr<int64_t>(), rows, logits.size(1), out.data_ptr<float>(), streamOf(logits));
    ctx->save_for_backward({logits, labels});
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &labels = saved[1];
    const at::Tensor dloss = grads[0].to(at::kFloat).neg().contiguous();
    at::Tensor dlogits = at::empty_like(logits);
    run(&loom_kernel_table::cross_entropy_backward, logits, dtypeOf(logits), logits.const_data_ptr(),
        labels.const_data_ptr<int64_t>(), /*lse=*/static_cast<const float*>(nullptr), dloss.const_data_ptr<float>(),
        dlogits.data_ptr(), logits.size(0), logits.size(1), kNoIgnoredLabel, streamOf(logits));
    return {dlogits, at::Tensor()};
  }
};

// Labels the kernels can read: one per row of logits, on the same device.
bool labelsFit(const at::Tensor& logits, const at::Tensor& labels) {
  return labels.device() == logits.device() && labels.numel() == logits.size(0);
}

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const bool usable = pluginServes(&loom_kernel_table::rms_norm_forward, &loom_kernel_table::rms_norm_backward, x) &&
                      pluginDtype(x) && weight.scalar_type() == x.scalar_type() && weight.device() == x.device() &&
                      weight.numel() == x.size(-1);
  return pluginOr(
      usable, [&] { return RmsNormFunction::apply(x, weight, eps); },
      [&] { return referenceOps().rmsNorm(x, weight, eps); });
}

std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                       const at::Tensor& sin) {
  const bool sameTypes = k.scalar_type() == q.scalar_type() && cos.scalar_type() == q.scalar_type() &&
                         sin.scalar_type() == q.scalar_type();
  const bool cosShape = (cos.dim() == 2 || cos.dim() == 3) && cos.sizes() == sin.sizes();
  const bool usable = pluginServes(&loom_kernel_table::rope_forward, &loom_kernel_table::rope_backward, q) &&
                      pluginDtype(q) && sameTypes && cosShape && q.dim() == 4 && k.dim() == 4;
  return pluginOr(
      usable,
      [&] {
        tensor_list out = RopeFunction::apply(q, k, cos, sin);
        return std::make_pair(out[0], out[1]);
      },
      [&] { return referenceOps().rope(q, k, cos, sin); });
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  const bool usable = pluginServes(&loom_kernel_table::swiglu_forward, &loom_kernel_table::swiglu_backward, gate) &&
                      pluginDtype(gate) && up.scalar_type() == gate.scalar_type() && up.sizes() == gate.sizes();
  return pluginOr(
      usable, [&] { return SwigluFunction::apply(gate, up); }, [&] { return referenceOps().swiglu(gate, up); });
}

at::Tensor clampedSwiglu(const at::Tensor& gate, const at::Tensor& up, double alpha, double limit) {
  const bool usable = pluginServes(&loom_kernel_table::clamped_swiglu_forward,
                                   &loom_kernel_table::clamped_swiglu_backward, gate) &&
                      pluginDtype(gate) && up.scalar_type() == gate.scalar_type() && up.sizes() == gate.sizes();
  return pluginOr(
      usable, [&] { return ClampedSwigluFunction::apply(gate, up, alpha, limit); },
      [&] { return referenceOps().clampedSwiglu(gate, up, alpha, limit); });
}

at::Tensor crossEntropy(const at::Tensor& logits, const at::Tensor& labels) {
  const bool usable =
      pluginServes(&loom_kernel_table::cross_entropy_forward, &loom_kernel_table::cross_entropy_backward, logits) &&
      pluginDtype(logits) && logits.dim() == 2 && labelsFit(logits, labels);
  return pluginOr(
      usable, [&] { return CrossEntropyFunction::apply(logits, labels); },
      [&] { return referenceOps().crossEntropy(logits, labels); });
}

at::Tensor logprobs(const at::Tensor& logits, const at::Tensor& labels) {
  const bool usable = pluginServes(&loom_kernel_table::logprobs, &loom_kernel_table::cross_entropy_backward, logits) &&
                      pluginDtype(logits) && logits.dim() == 2 && labelsFit(logits, labels);
  return pluginOr(
      usable, [&] { return LogprobsFunction::apply(logits, labels); },
      [&] { return referenceOps().logprobs(logits, labels); });
}

// Through the plugin where nothing wants a gradient: logits [N, V] of a dtype it takes; else
// torch's argmax and the table's logprobs.
std::pair<at::Tensor, at::Tensor> greedyLogprobs(const at::Tensor& logits) {
  const bool usable = gRegistry && gRegistry->pluginProvides(&loom_kernel_table::greedy_logprobs, deviceName(logits)) &&
                      pluginDtype(logits) && logits.dim() == 2 && logits.is_contiguous() &&
                      !(at::GradMode::is_enabled() && logits.requires_grad());
  return pluginOr(
      usable,
      [&] {
        const int64_t rows = logits.size(0);
        at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
        at::Tensor chosen = at::empty({rows}, logits.options().dtype(at::kFloat));
        run(&loom_kernel_table::greedy_logprobs, logits, dtypeOf(logits), logits.const_data_ptr(), rows,
            logits.size(1), tokens.data_ptr<int64_t>(), chosen.data_ptr<float>(), streamOf(logits));
        return std::pair{tokens, chosen};
      },
      [&] {
        at::Tensor tokens = logits.argmax(-1);
        return std::pair{tokens, logprobs(logits, tokens)};
      });
}

// The step's decodes (its single-query sequences, first) through the plugin; its prompt chunks, if
// any, through the reference.
at::Tensor pagedAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                          const PagedSequences& s) {
  const int64_t decodes = s.numSingleQuery;
  const bool usable = decodes > 0 && gRegistry &&
                      gRegistry->pluginProvides(&loom_kernel_table::paged_attention_decode, deviceName(q)) &&
                      pluginDtype(q) && keys.scalar_type() == q.scalar_type() && keys.is_contiguous() &&
                      values.is_contiguous() && s.blockTables.scalar_type() == at::kLong;
  if (!usable) return referenceOps().pagedAttention(q, keys, values, s);
  const at::Tensor queries = q.narrow(0, 0, decodes).contiguous();
  const at::Tensor tables = s.blockTables.narrow(0, 0, decodes).contiguous();
  const at::Tensor lengths = s.contextLens.narrow(0, 0, decodes).contiguous();
  at::Tensor out = at::empty_like(q);
  at::Tensor decoded = out.narrow(0, 0, decodes);
  try {
    run(&loom_kernel_table::paged_attention_decode, q, dtypeOf(q), queries.const_data_ptr(), keys.const_data_ptr(),
        values.const_data_ptr(), tables.const_data_ptr<int64_t>(), lengths.const_data_ptr<int64_t>(),
        decoded.data_ptr(), decodes, q.size(1), keys.size(2), q.size(2), keys.size(1), tables.size(1),
        1.0 / std::sqrt(static_cast<double>(q.size(2))), s.slidingWindow, streamOf(q));
  } catch (const Refused&) {
    return referenceOps().pagedAttention(q, keys, values, s);
  }
  const int64_t rest = s.numSequences() - decodes;
  if (rest > 0) {
    PagedSequences chunks = s;
    chunks.blockTables = s.blockTables.narrow(0, decodes, rest);
    chunks.contextLens = s.contextLens.narrow(0, decodes, rest);
    chunks.contextLensHost.assign(s.contextLensHost.begin() + decodes, s.contextLensHost.end());
    const int64_t begin = s.queryStarts[decodes];
    chunks.queryStarts.clear();
    for (size_t i = decodes; i < s.queryStarts.size(); ++i) chunks.queryStarts.push_back(s.queryStarts[i] - begin);
    chunks.numSingleQuery = 0;
    const int64_t tokens = s.numTokens() - begin;
    out.narrow(0, begin, tokens).copy_(referenceOps().pagedAttention(q.narrow(0, begin, tokens), keys, values, chunks));
  }
  return out;
}

// Through the plugin where every tensor is of q's dtype and device and laid out as the slot
// reads it (heads of D contiguous, k and v rows equally spaced), and nothing wants a gradient.
at::Tensor ropeKvWrite(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const QkNorms& norms,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                       const at::Tensor& keyCache, const at::Tensor& valueCache) {
  auto headsInPlace = [](const at::Tensor& x, int64_t d) {
    return x.dim() == 3 && x.size(2) == d && x.stride(2) == 1 && x.stride(1) == d;
  };
  auto alike = [&](const at::Tensor& x) {
    return !x.defined() || (x.scalar_type() == q.scalar_type() && x.device() == q.device() && x.is_contiguous());
  };
  const int64_t d = q.size(-1);
  const bool usable =
      gRegistry && gRegistry->pluginProvides(&loom_kernel_table::rope_kv_write, deviceName(q)) && pluginDtype(q) &&
      !(at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) &&
      headsInPlace(q, d) && headsInPlace(k, d) && headsInPlace(v, d) && k.stride(0) == v.stride(0) &&
      k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() && alike(norms.q) && alike(norms.k) &&
      alike(cos) && alike(sin) && alike(keyCache) && alike(valueCache) && slots.scalar_type() == at::kLong &&
      slots.device() == q.device() && slots.is_contiguous();
  return pluginOr(
      usable,
      [&] {
        at::Tensor out = at::empty({q.size(0), q.size(1), d}, q.options());
        run(&loom_kernel_table::rope_kv_write, q, dtypeOf(q), q.const_data_ptr(), k.const_data_ptr(),
            v.const_data_ptr(), q.stride(0), k.stride(0), norms.q.defined() ? norms.q.const_data_ptr() : nullptr,
            norms.k.defined() ? norms.k.const_data_ptr() : nullptr, norms.eps, cos.const_data_ptr(),
            sin.const_data_ptr(), slots.const_data_ptr<int64_t>(), out.data_ptr(), keyCache.data_ptr(),
            valueCache.data_ptr(), q.size(0), q.size(1), k.size(1), d, streamOf(q));
        return out;
      },
      [&] { return referenceOps().ropeKvWrite(q, k, v, norms, cos, sin, slots, keyCache, valueCache); });
}

// Through the plugin where nothing wants a gradient and x, residual and weight are alike (dtype,
// device, contiguous rows of the weight's length); else the add, then the table's RMSNorm.
std::pair<at::Tensor, at::Tensor> addRmsNorm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                             double eps) {
  auto alike = [&](const at::Tensor& t) {
    return t.scalar_type() == x.scalar_type() && t.device() == x.device() && t.is_contiguous();
  };
  const bool usable =
      gRegistry && gRegistry->pluginProvides(&loom_kernel_table::add_rms_norm, deviceName(x)) && pluginDtype(x) &&
      !(at::GradMode::is_enabled() && (x.requires_grad() || residual.requires_grad() || weight.requires_grad())) &&
      x.dim() > 0 && residual.sizes() == x.sizes() && weight.dim() == 1 && weight.numel() == x.size(-1) &&
      alike(x) && alike(residual) && alike(weight);
  return pluginOr(
      usable,
      [&] {
        at::Tensor sum = at::empty_like(x), y = at::empty_like(x);
        const int64_t dim = x.size(-1);
        run(&loom_kernel_table::add_rms_norm, x, dtypeOf(x), x.const_data_ptr(), residual.const_data_ptr(),
            weight.const_data_ptr(), sum.data_ptr(), y.data_ptr(), dim == 0 ? 0 : x.numel() / dim, dim, eps,
            streamOf(x));
        return std::pair{sum, y};
      },
      [&] {
        at::Tensor sum = x + residual;
        return std::pair{sum, rmsNorm(sum, weight, eps)};
      });
}

}  // namespace

bool pluginPagedDecode(const c10::Device& device) {
  return gRegistry &&
         gRegistry->pluginProvides(&loom_kernel_table::paged_attention_decode, device.is_cuda() ? "cuda" : "cpu");
}

void usePluginOps(const kernels::KernelRegistry& registry) {
  gRegistry = &registry;
  if (registry.plugins().empty()) return;
  OpTable& table = ops();
  table.rmsNorm = rmsNorm;
  table.rope = rope;
  table.swiglu = swiglu;
  table.clampedSwiglu = clampedSwiglu;
  table.crossEntropy = crossEntropy;
  table.logprobs = logprobs;
  table.pagedAttention = pagedAttention;
  table.ropeKvWrite = ropeKvWrite;
  table.addRmsNorm = addRmsNorm;
  table.greedyLogprobs = greedyLogprobs;
}

}  // namespace loom::worker
