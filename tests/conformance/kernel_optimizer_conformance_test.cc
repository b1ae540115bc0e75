// The CPU plugin's optimizer steps against the libtorch reference (torch.optim's formulas for
// AdamW, Adam with L2 and Adagrad; lucidrains' / DeepSpeed's for Lion): 10 steps from the same
// start with the same fresh gradients, then the parameters and every state tensor compared.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "tests/catch.h"
#include "tests/conformance/kernel_conformance.h"

using namespace loom::testing;

namespace {

constexpr int kSteps = 10;
constexpr int64_t kSizes[] = {1, 17, 1000, 100003};

using Pair = OptimizerState;

// Both sides start from the same param; state zero.
std::pair<Pair, Pair> start(int64_t n, loom_dtype paramDtype, bool second) {
  const at::Tensor p = randomInput({n}, paramDtype);
  auto make = [&] { return Pair{p.clone(), at::zeros({n}), second ? at::zeros({n}) : at::Tensor()}; };
  return {make(), make()};
}

struct Dtypes {
  loom_dtype param, grad;
};
constexpr Dtypes kDtypeCases[] = {{LOOM_DTYPE_F32, LOOM_DTYPE_F32},
                                  {LOOM_DTYPE_BF16, LOOM_DTYPE_F32},
                                  {LOOM_DTYPE_BF16, LOOM_DTYPE_BF16},
                                  {LOOM_DTYPE_F32, LOOM_DTYPE_BF16}};

}  // namespace

TEST_CASE("adamw_step matches torch.optim's AdamW and Adam formulas over 10 steps", "[kernels]") {
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
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (const Case& c : cases) {
      for (Dtypes dt : kDtypeCases) {
        for (int64_t n : kSizes) {
          const std::string what = fmt::format("{} {} param {} grad {} [{}]", c.name, setup.label(),
                                               dtypeName(dt.param), dtypeName(dt.grad), n);
          auto [mine, ref] = start(n, dt.param, true);
          OptimizerTerms terms = OptimizerTerms::of(ref);
          for (int step = 1; step <= kSteps; ++step) {
            const at::Tensor grad = randomInput({n}, dt.grad);
            loom_adam_config config = c.config;
            config.step = step;
            const Pair before = ref.copy();
            for (auto [side, table] : {std::pair{&mine, &cpuPlugin()}, std::pair{&ref, &referenceTable()}})
              REQUIRE(table->adamw_step(&config, dt.param, side->param.data_ptr(), dt.grad, grad.data_ptr(),
                                        side->first.data_ptr<float>(), side->second.data_ptr<float>(), n,
                                        nullptr) == LOOM_KERNEL_OK);
            terms.add(before, ref);
          }
          compareOptimizerStates(mine, ref, terms, dt.param, what);
        }
      }
    }
  }
}

TEST_CASE("lion_step matches the Lion reference over 10 steps", "[kernels]") {
  const loom_lion_config config{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (Dtypes dt : kDtypeCases) {
      for (int64_t n : kSizes) {
        const std::string what =
            fmt::format("Lion {} param {} grad {} [{}]", setup.label(), dtypeName(dt.param), dtypeName(dt.grad), n);
        auto [mine, ref] = start(n, dt.param, false);
        OptimizerTerms terms = OptimizerTerms::of(ref);
        for (int step = 1; step <= kSteps; ++step) {
          const at::Tensor grad = randomInput({n}, dt.grad);
          const Pair before = ref.copy();
          for (auto [side, table] : {std::pair{&mine, &cpuPlugin()}, std::pair{&ref, &referenceTable()}})
            REQUIRE(table->lion_step(&config, dt.param, side->param.data_ptr(), dt.grad, grad.data_ptr(),
                                     side->first.data_ptr<float>(), n, nullptr) == LOOM_KERNEL_OK);
          terms.add(before, ref);
        }
        compareOptimizerStates(mine, ref, terms, dt.param, what);
      }
    }
  }
}

TEST_CASE("adagrad_step matches torch.optim's Adagrad over 10 steps", "[kernels]") {
  const loom_adagrad_config configs[] = {{.lr = 1e-2, .eps = 1e-10, .weight_decay = 0.0},
                                         {.lr = 1e-2, .eps = 1e-10, .weight_decay = 0.01}};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (const loom_adagrad_config& config : configs) {
      for (Dtypes dt : kDtypeCases) {
        for (int64_t n : kSizes) {
          const std::string what = fmt::format("Adagrad wd {} {} param {} grad {} [{}]", config.weight_decay,
                                               setup.label(), dtypeName(dt.param), dtypeName(dt.grad), n);
          auto [mine, ref] = start(n, dt.param, false);
          OptimizerTerms terms = OptimizerTerms::of(ref);
          for (int step = 1; step <= kSteps; ++step) {
            const at::Tensor grad = randomInput({n}, dt.grad);
            const Pair before = ref.copy();
            for (auto [side, table] : {std::pair{&mine, &cpuPlugin()}, std::pair{&ref, &referenceTable()}})
              REQUIRE(table->adagrad_step(&config, dt.param, side->param.data_ptr(), dt.grad, grad.data_ptr(),
                                          side->first.data_ptr<float>(), n, nullptr) == LOOM_KERNEL_OK);
            terms.add(before, ref);
          }
          compareOptimizerStates(mine, ref, terms, dt.param, what);
        }
      }
    }
  }
}

TEST_CASE("amsgrad is refused by the plugin and the reference, and nothing is written", "[kernels]") {
  loom_adam_config config{.lr = 1e-3,
                          .beta1 = 0.9,
                          .beta2 = 0.999,
                          .eps = 1e-8,
                          .step = 1,
                          .bias_correction = 1,
                          .decoupled_weight_decay = 1,
                          .amsgrad = 1};
  for (const loom_kernel_table* table : {&cpuPlugin(), &referenceTable()}) {
    at::Tensor p = at::ones({8}), g = at::ones({8}), m = at::zeros({8}), v = at::zeros({8});
    INFO(table->name);
    CHECK(table->adamw_step(&config, LOOM_DTYPE_F32, p.data_ptr(), LOOM_DTYPE_F32, g.data_ptr(), m.data_ptr<float>(),
                            v.data_ptr<float>(), 8, nullptr) == LOOM_KERNEL_UNSUPPORTED);
    CHECK(std::string(table->last_error()).find("amsgrad is not supported") != std::string::npos);
    CHECK(p.equal(at::ones({8})));
    CHECK(m.equal(at::zeros({8})));
  }
}
