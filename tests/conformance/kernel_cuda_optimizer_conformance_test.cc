// The CUDA plugin's optimizer steps against the libtorch reference (reference_ops.h: torch.optim's
// formulas for AdamW, Adam with L2 and Adagrad; lucidrains' / DeepSpeed's for Lion) on the same
// CUDA tensors: 10 steps from the same start with the same fresh gradients, then the parameters
// and every state tensor compared, on the default stream and on a pool stream.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kernels/reference/reference_ops.h"
#include "tests/catch.h"
#include "tests/conformance/kernel_cuda_conformance.h"

using namespace loom::testing;
namespace ref = loom::kernels::reference;

namespace {

constexpr int kSteps = 10;
constexpr int64_t kSizes[] = {1, 17, 1000, 100003, (1 << 20) + 5};

struct Dtypes {
  loom_dtype param, grad;
};
constexpr Dtypes kDtypeCases[] = {{LOOM_DTYPE_F32, LOOM_DTYPE_F32},
                                  {LOOM_DTYPE_BF16, LOOM_DTYPE_F32},
                                  {LOOM_DTYPE_BF16, LOOM_DTYPE_BF16},
                                  {LOOM_DTYPE_F32, LOOM_DTYPE_BF16}};

// A tensor of n on the GPU, starting `offset` elements into its allocation (offset 1: no
// 16-byte loads anywhere in the kernel).
at::Tensor placed(const at::Tensor& values, int64_t offset) {
  at::Tensor t = at::empty({values.numel() + offset}, values.options().device(at::kCUDA)).slice(0, offset);
  t.copy_(values);
  return t;
}

// Both sides start from the same param; state zero.
std::pair<OptimizerState, OptimizerState> start(int64_t n, loom_dtype paramDtype, bool second, int64_t offset) {
  const at::Tensor p = randomInput({n}, paramDtype);
  auto make = [&] {
    return OptimizerState{placed(p, offset), placed(at::zeros({n}), offset),
                          second ? placed(at::zeros({n}), offset) : at::Tensor()};
  };
  return {make(), make()};
}

// Runs kSteps steps of `mine` (the plugin) and `reference` on both sides, then compares.
template <typename Mine, typename Reference>
void runSteps(const std::string& what, Dtypes dt, int64_t n, bool second, int64_t offset, Mine&& mine,
              Reference&& reference) {
  auto [plugin, expected] = start(n, dt.param, second, offset);
  OptimizerTerms terms = OptimizerTerms::of(expected);
  for (int step = 1; step <= kSteps; ++step) {
    const at::Tensor grad = placed(randomInput({n}, dt.grad), offset);
    REQUIRE(mine(step, plugin, grad) == LOOM_KERNEL_OK);
    const OptimizerState before = expected.copy();
    reference(step, expected, grad);
    terms.add(before, expected);
  }
  compareOptimizerStates(plugin, expected, terms, dt.param, what);
}

// Every stream, dtype pair, size and alignment.
template <typename Body>
void forEachCase(const std::string& name, Body&& body) {
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (Dtypes dt : kDtypeCases)
      for (int64_t n : kSizes)
        for (int64_t offset : {0, 1})
          body(fmt::format("{} {} param {} grad {} [{}]{}", name, pass.label(), dtypeName(dt.param),
                           dtypeName(dt.grad), n, offset ? " unaligned" : ""),
               pass.stream(), dt, n, offset);
  }
}

}  // namespace

TEST_CASE("CUDA adamw_step matches torch.optim's AdamW and Adam formulas over 10 steps", "[gpu][kernels]") {
  struct Case {
    const char* name;
    loom_adam_config config;
  };
  const Case cases[] = {
      {"AdamW wd 0.1",
       {.lr = 1e-3,
        .beta1 = 0.9,
        .beta2 = 0.999,
        .eps = 1e-8,
        .weight_decay = 0.1,
        .bias_correction = 1,
        .decoupled_weight_decay = 1}},
      {"Adam L2 wd 0.01",
       {.lr = 2e-3,
        .beta1 = 0.9,
        .beta2 = 0.95,
        .eps = 1e-6,
        .weight_decay = 0.01,
        .bias_correction = 1,
        .decoupled_weight_decay = 0}},
      {"Adam no bias correction, beta1 0.3",
       {.lr = 1e-2,
        .beta1 = 0.3,
        .beta2 = 0.99,
        .eps = 1e-8,
        .weight_decay = 0.0,
        .bias_correction = 0,
        .decoupled_weight_decay = 1}},
  };
  for (const Case& c : cases) {
    forEachCase(c.name, [&](const std::string& what, void* stream, Dtypes dt, int64_t n, int64_t offset) {
      auto configAt = [&](int step) {
        loom_adam_config config = c.config;
        config.step = step;
        return config;
      };
      runSteps(
          what, dt, n, true, offset,
          [&](int step, OptimizerState& s, const at::Tensor& grad) {
            const loom_adam_config config = configAt(step);
            return cudaPlugin().adamw_step(&config, dt.param, s.param.data_ptr(), dt.grad, grad.data_ptr(),
                                           s.first.data_ptr<float>(), s.second.data_ptr<float>(), n, stream);
          },
          [&](int step, OptimizerState& s, const at::Tensor& grad) {
            ref::adamStep(configAt(step), s.param, grad, s.first, s.second);
          });
    });
  }
}

TEST_CASE("CUDA lion_step matches the Lion reference over 10 steps", "[gpu][kernels]") {
  const loom_lion_config config{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1};
  forEachCase("Lion", [&](const std::string& what, void* stream, Dtypes dt, int64_t n, int64_t offset) {
    runSteps(
        what, dt, n, false, offset,
        [&](int, OptimizerState& s, const at::Tensor& grad) {
          return cudaPlugin().lion_step(&config, dt.param, s.param.data_ptr(), dt.grad, grad.data_ptr(),
                                        s.first.data_ptr<float>(), n, stream);
        },
        [&](int, OptimizerState& s, const at::Tensor& grad) { ref::lionStep(config, s.param, grad, s.first); });
  });
}

TEST_CASE("CUDA adagrad_step matches torch.optim's Adagrad over 10 steps", "[gpu][kernels]") {
  const loom_adagrad_config configs[] = {{.lr = 1e-2, .eps = 1e-10, .weight_decay = 0.0},
                                         {.lr = 1e-2, .eps = 1e-10, .weight_decay = 0.01}};
  for (const loom_adagrad_config& config : configs) {
    forEachCase(fmt::format("Adagrad wd {}", config.weight_decay),
                [&](const std::string& what, void* stream, Dtypes dt, int64_t n, int64_t offset) {
                  runSteps(
                      what, dt, n, false, offset,
                      [&](int, OptimizerState& s, const at::Tensor& grad) {
                        return cudaPlugin().adagrad_step(&config, dt.param, s.param.data_ptr(), dt.grad,
                                                         grad.data_ptr(), s.first.data_ptr<float>(), n, stream);
                      },
                      [&](int, OptimizerState& s, const at::Tensor& grad) {
                        ref::adagradStep(config, s.param, grad, s.first);
                      });
                });
  }
}

TEST_CASE("CUDA adamw_step refuses amsgrad and writes nothing", "[gpu][kernels]") {
  loom_adam_config config{.lr = 1e-3,
                          .beta1 = 0.9,
                          .beta2 = 0.999,
                          .eps = 1e-8,
                          .step = 1,
                          .bias_correction = 1,
                          .decoupled_weight_decay = 1,
                          .amsgrad = 1};
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::Tensor p = at::ones({8}, cuda), g = at::ones({8}, cuda), m = at::zeros({8}, cuda), v = at::zeros({8}, cuda);
  CHECK(cudaPlugin().adamw_step(&config, LOOM_DTYPE_F32, p.data_ptr(), LOOM_DTYPE_F32, g.data_ptr(),
                                m.data_ptr<float>(), v.data_ptr<float>(), 8, nullptr) == LOOM_KERNEL_UNSUPPORTED);
  CHECK(std::string(cudaPlugin().last_error()).find("amsgrad is not supported") != std::string::npos);
  CHECK(p.equal(at::ones({8}, cuda)));
  CHECK(m.equal(at::zeros({8}, cuda)));
}
