// The model's op table on the CPU plugin (worker/torch/model/plugin_ops.h): each op's values and the
// gradients autograd takes through it match the libtorch reference ops, and calls the plugin
// cannot take (fp16) stay on the reference.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <functional>
#include <vector>

#include "kernels/reference/reference_table.h"
#include "tests/catch.h"
#include "tests/conformance/kernel_conformance.h"
#include "worker/torch/model/ops.h"
#include "worker/torch/model/plugin_ops.h"

using namespace loom::testing;
using loom::worker::ops;
using loom::worker::referenceOps;

namespace {

// A registry holding the CPU plugin and the reference, with the op table pointed at it.
void usePlugin() {
  static loom::kernels::KernelRegistry* registry = [] {
    auto* r = new loom::kernels::KernelRegistry;
    configurePlugin(pluginSetups().back());  // the best instruction set, on libtorch's threads
    r->addPlugin(&cpuPlugin(), LOOM_CPU_PLUGIN_PATH);
    r->addReference(loom::kernels::reference::referenceKernelTable());
    return r;
  }();
  loom::worker::usePluginOps(*registry);
}

using Op = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

double maxAbs(const at::Tensor& t) { return t.numel() ? t.abs().max().item<double>() : 0.0; }

// Runs `plugin` and `reference` on copies of `inputs` (the first `differentiable` of them leaves
// that require grad), takes the gradients of the same random weighting of every output, and
// compares outputs and gradients: fp32 within 1e-5 and bf16 within 2e-2 of the largest value
// (the ops cancel: their error is relative to the terms, not to each element). Returns the
// plugin's outputs.
std::vector<at::Tensor> compare(const std::string& what, const std::vector<at::Tensor>& inputs, size_t differentiable,
                                const Op& plugin, const Op& reference) {
  auto run = [&](const Op& op) {
    std::vector<at::Tensor> in;
    for (size_t i = 0; i < inputs.size(); ++i)
      in.push_back(i < differentiable ? inputs[i].clone().requires_grad_(true) : inputs[i]);
    std::vector<at::Tensor> out = op(in);
    at::Tensor total = at::zeros({}, at::kDouble);
    at::manual_seed(7);
    for (const at::Tensor& o : out) total = total + (o.to(at::kDouble) * at::randn(o.sizes(), at::kDouble)).sum();
    std::vector<at::Tensor> leaves(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(differentiable));
    std::vector<at::Tensor> grads = torch::autograd::grad({total}, leaves);
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  };
  const std::vector<at::Tensor> got = run(plugin), want = run(reference);
  REQUIRE(got.size() == want.size());
  const bool bf16 = inputs[0].scalar_type() == at::kBFloat16;
  for (size_t i = 0; i < got.size(); ++i) {
    const double rtol = bf16 ? 2e-2 : 1e-5;
    INFO(what << " result " << i);
    REQUIRE(got[i].scalar_type() == want[i].scalar_type());
    requireClose(got[i], want[i], {rtol, rtol * maxAbs(want[i])}, fmt::format("{} result {}", what, i));
  }
  return got;
}

// The autograd node a result came from: the plugin's functions are C++ nodes named after them.
std::string nodeOf(const at::Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : "none"; }

const at::ScalarType kTypes[] = {at::kFloat, at::kBFloat16};

at::Tensor randn(at::IntArrayRef sizes, at::ScalarType type) { return at::randn(sizes).to(type); }

}  // namespace

TEST_CASE("rms_norm through the plugin matches the reference with its gradients", "[kernels]") {
  usePlugin();
  for (at::ScalarType type : kTypes) {
    const std::vector<at::Tensor> in = {randn({2, 5, 48}, type), randn({48}, type)};
    auto y = compare(
        fmt::format("rms_norm {}", c10::toString(type)), in, 2,
        [](const auto& t) { return std::vector<at::Tensor>{ops().rmsNorm(t[0], t[1], 1e-5)}; },
        [](const auto& t) { return std::vector<at::Tensor>{referenceOps().rmsNorm(t[0], t[1], 1e-5)}; });
  }
  // The routing itself: fp32 goes to the plugin's function, fp16 stays on libtorch's ops.
  at::Tensor x = at::randn({3, 8}).requires_grad_(true);
  CHECK(nodeOf(ops().rmsNorm(x, at::ones({8}), 1e-6)).find("RmsNormFunction") != std::string::npos);
  at::Tensor half = at::randn({3, 8}).to(at::kHalf).requires_grad_(true);
  CHECK(nodeOf(ops().rmsNorm(half, at::ones({8}, at::kHalf), 1e-6)).find("RmsNormFunction") == std::string::npos);
}

TEST_CASE("add_rms_norm through the plugin matches the reference, and keeps gradients where they are wanted",
          "[kernels]") {
  usePlugin();
  for (at::ScalarType type : kTypes) {
    const std::string what = fmt::format("add_rms_norm {}", c10::toString(type));
    const at::Tensor x = randn({2, 5, 48}, type), residual = randn({2, 5, 48}, type), w = randn({48}, type);
    at::NoGradGuard noGrad;
    auto [sum, y] = ops().addRmsNorm(x, residual, w, 1e-5);
    auto [sumRef, yRef] = referenceOps().addRmsNorm(x, residual, w, 1e-5);
    CHECK(at::equal(sum, sumRef));
    const double rtol = type == at::kBFloat16 ? 2e-2 : 1e-5;
    requireClose(y, yRef, {rtol, rtol * maxAbs(yRef)}, what + " y");
  }
  // With a gradient wanted it is the add and the table's rms_norm, which autograd goes through.
  const std::vector<at::Tensor> in = {randn({3, 16}, at::kFloat), randn({3, 16}, at::kFloat), randn({16}, at::kFloat)};
  auto outputs = [](auto addRmsNorm) {
    return [addRmsNorm](const std::vector<at::Tensor>& t) {
      auto [sum, y] = addRmsNorm(t[0], t[1], t[2], 1e-5);
      return std::vector<at::Tensor>{sum, y};
    };
  };
  const std::vector<at::Tensor> got =
      compare("add_rms_norm with gradients", in, 3, outputs(ops().addRmsNorm), outputs(referenceOps().addRmsNorm));
  CHECK(nodeOf(got[1]).find("RmsNormFunction") != std::string::npos);
}

TEST_CASE("rope through the plugin matches the reference on transposed q and k", "[kernels]") {
  usePlugin();
  for (at::ScalarType type : kTypes) {
    // The model hands rope q and k as [B, S, H, D] transposed to [B, H, S, D]: not contiguous.
    const std::vector<at::Tensor> in = {randn({2, 6, 4, 16}, type), randn({2, 6, 2, 16}, type),
                                        randn({6, 16}, type), randn({6, 16}, type)};
    auto apply = [](auto fn) {
      return [fn](const std::vector<at::Tensor>& t) {
        auto [q, k] = fn(t[0].transpose(1, 2), t[1].transpose(1, 2), t[2], t[3]);
        return std::vector<at::Tensor>{q, k};
      };
    };
    auto out = compare(fmt::format("rope {}", c10::toString(type)), in, 2, apply(ops().rope),
                       apply(referenceOps().rope));
    CHECK(nodeOf(out[0]).find("RopeFunction") != std::string::npos);
  }
}

TEST_CASE("rope_kv_write through the plugin matches the reference on views of a fused projection", "[kernels]") {
  usePlugin();
  for (at::ScalarType type : kTypes) {
    for (bool norms : {false, true}) {
      const std::string what = fmt::format("rope_kv_write {}{}", c10::toString(type), norms ? ", q/k norms" : "");
      // A step of 6 tokens: 4 query heads and 2 KV heads of 16, as the model slices its fused
      // q/k/v projection; 8 rows of cache, the tokens' slots scattered over them.
      const at::Tensor projection = randn({6, 8, 16}, type);
      const at::Tensor q = projection.narrow(1, 0, 4), k = projection.narrow(1, 4, 2), v = projection.narrow(1, 6, 2);
      const loom::worker::QkNorms qk = norms ? loom::worker::QkNorms{.q = randn({16}, type), .k = randn({16}, type),
                                                                     .eps = 1e-6}
                                             : loom::worker::QkNorms{};
      const at::Tensor cos = randn({6, 16}, type), sin = randn({6, 16}, type);
      const at::Tensor slots = at::tensor({7, 0, 3, 5, 1, 6}, at::kLong);
      const at::Tensor cache = randn({4, 2, 2, 16}, type);  // [blocks, block size, KV heads, dim]
      at::Tensor keys = cache.clone(), values = cache.clone(), refKeys = cache.clone(), refValues = cache.clone();
      const at::Tensor out = ops().ropeKvWrite(q, k, v, qk, cos, sin, slots, keys, values);
      const at::Tensor want = referenceOps().ropeKvWrite(q, k, v, qk, cos, sin, slots, refKeys, refValues);
      const double rtol = type == at::kBFloat16 ? 2e-2 : 1e-5;
      requireClose(out, want, {rtol, rtol * maxAbs(want)}, what + " q");
      requireClose(keys, refKeys, {rtol, rtol * maxAbs(refKeys)}, what + " keys");
      CHECK(at::equal(values, refValues));
      CHECK(!at::equal(values, cache));  // the values were written
    }
  }
}

TEST_CASE("swiglu through the plugin matches the reference with its gradients", "[kernels]") {
  usePlugin();
  for (at::ScalarType type : kTypes) {
    const std::vector<at::Tensor> in = {randn({3, 7, 40}, type), randn({3, 7, 40}, type)};
    auto out = compare(
        fmt::format("swiglu {}", c10::toString(type)), in, 2,
        [](const auto& t) { return std::vector<at::Tensor>{ops().swiglu(t[0], t[1])}; },
        [](const auto& t) { return std::vector<at::Tensor>{referenceOps().swiglu(t[0], t[1])}; });
    CHECK(nodeOf(out[0]).find("SwigluFunction") != std::string::npos);
  }
}

TEST_CASE("cross entropy and logprobs through the plugin match the reference", "[kernels]") {
  usePlugin();
  for (at::ScalarType type : kTypes) {
    at::Tensor labels = at::randint(0, 300, {24}, at::kLong);
    labels.index_put_({at::arange(0, 24, 5)}, -100);  // ignored rows count neither loss nor rows
    const std::vector<at::Tensor> in = {randn({24, 300}, type) * 3, labels};
    auto loss = compare(
        fmt::format("cross entropy {}", c10::toString(type)), in, 1,
        [](const auto& t) { return std::vector<at::Tensor>{ops().crossEntropy(t[0], t[1])}; },
        [](const auto& t) { return std::vector<at::Tensor>{referenceOps().crossEntropy(t[0], t[1])}; });
    CHECK(nodeOf(loss[0]).find("CrossEntropyFunction") != std::string::npos);

    const std::vector<at::Tensor> valid = {in[0], labels.clamp_min(0)};
    auto logprobs = compare(
        fmt::format("logprobs {}", c10::toString(type)), valid, 1,
        [](const auto& t) { return std::vector<at::Tensor>{ops().logprobs(t[0], t[1])}; },
        [](const auto& t) { return std::vector<at::Tensor>{referenceOps().logprobs(t[0], t[1])}; });
    CHECK(nodeOf(logprobs[0]).find("LogprobsFunction") != std::string::npos);
  }
}

TEST_CASE("greedy picks and their logprobs through the plugin match torch's argmax and the reference logprobs",
          "[kernels]") {
  usePlugin();
  for (at::ScalarType type : kTypes) {
    const at::Tensor logits = randn({7, 300}, type);
    auto [tokens, chosen] = ops().greedyLogprobs(logits);
    auto [tokensRef, chosenRef] = referenceOps().greedyLogprobs(logits);
    CHECK(at::equal(tokens, logits.argmax(-1)));
    CHECK(at::equal(tokens, tokensRef));
    requireClose(chosen, chosenRef, {1e-5, 1e-5 * maxAbs(chosenRef)}, fmt::format("greedy {}", c10::toString(type)));
  }
}

TEST_CASE("a label outside the vocabulary is an error naming the op", "[kernels]") {
  usePlugin();
  at::Tensor logits = at::randn({4, 10});
  at::Tensor labels = at::tensor({1, 2, 10, 3}, at::kLong);
  try {
    ops().crossEntropy(logits, labels);
    FAIL("a label of 10 over a vocabulary of 10 was taken");
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    INFO(message);
    CHECK(message.find("cross_entropy_forward") != std::string::npos);
  }
}

namespace {

int refuse() { return LOOM_KERNEL_UNSUPPORTED; }
const char* refusal() { return "this plugin takes no call"; }

// A plugin that provides every model op and refuses every call, as one built for another GPU does.
loom_kernel_table refusingTable() {
  loom_kernel_table t{};
  t.abi_version = LOOM_KERNEL_ABI_VERSION;
  t.struct_size = sizeof(loom_kernel_table);
  t.name = "refusing";
  t.device = "cpu";
  t.isa = "none";
  t.last_error = refusal;
  t.rms_norm_forward = [](loom_dtype, const void*, const void*, void*, float*, int64_t, int64_t, double, void*) {
    return refuse();
  };
  t.rms_norm_backward = [](loom_dtype, const void*, const void*, const void*, const float*, void*, float*, int64_t,
                           int64_t, double, void*) { return refuse(); };
  t.swiglu_forward = [](loom_dtype, const void*, const void*, void*, int64_t, void*) { return refuse(); };
  t.swiglu_backward = [](loom_dtype, const void*, const void*, const void*, void*, void*, int64_t, void*) {
    return refuse();
  };
  return t;
}

}  // namespace

TEST_CASE("a call every plugin refuses runs the libtorch reference instead", "[kernels]") {
  static const loom_kernel_table table = refusingTable();
  loom::kernels::KernelRegistry refusing;  // no reference: the refusal reaches the op table
  refusing.addPlugin(&table, "refusing (test)");
  loom::worker::usePluginOps(refusing);
  const at::Tensor x = at::randn({3, 16}).requires_grad_(true), w = at::randn({16}).requires_grad_(true);
  at::Tensor y = ops().rmsNorm(x, w, 1e-6);
  CHECK(at::equal(y, referenceOps().rmsNorm(x, w, 1e-6)));
  CHECK(nodeOf(y).find("RmsNormFunction") == std::string::npos);
  CHECK(at::equal(ops().swiglu(x, x), referenceOps().swiglu(x, x)));
  usePlugin();  // back to the CPU plugin for the other cases of this binary
}
