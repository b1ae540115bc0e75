#include "tests/conformance/kernel_conformance.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "kernels/loader.h"
#include "kernels/reference/reference_table.h"
#include "tests/catch.h"

namespace loom::testing {

const loom_kernel_table& cpuPlugin() {
  static const loom_kernel_table* table = [] {
    auto opened = kernels::openPlugin(LOOM_CPU_PLUGIN_PATH, nullptr);
    if (!opened.isOk()) {
      std::fprintf(stderr, "%s\n", opened.status().message().c_str());
      std::abort();
    }
    return *opened;
  }();
  return *table;
}

const loom_kernel_table& referenceTable() { return *kernels::reference::referenceKernelTable(); }

std::vector<PluginSetup> pluginSetups() {
  std::vector<PluginSetup> out;
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    configurePlugin({isa, false});
    // The plugin takes the best the processor has up to the limit: keep each path once.
    if (std::string(cpuPlugin().isa) == isa) out.push_back({isa, false});
  }
  if (!out.empty()) out.push_back({out.front().isa, true});
  return out;
}

void configurePlugin(const PluginSetup& setup) {
  loom_kernel_host host = setup.atenThreads
                              ? kernels::reference::atenKernelHost()
                              : loom_kernel_host{.struct_size = sizeof(loom_kernel_host), .num_threads = 2};
  host.isa = setup.isa.c_str();
  const int rc = cpuPlugin().init(&host);
  REQUIRE(rc == LOOM_KERNEL_OK);
}

uint64_t testSeed() {
  static const uint64_t seed = [] {
    const char* fixed = std::getenv("LOOM_TEST_SEED");
    const uint64_t s = fixed ? std::strtoull(fixed, nullptr, 10) : std::random_device{}();
    std::printf("kernel conformance: random inputs from seed %llu (LOOM_TEST_SEED=%llu repeats them)\n",
                static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    at::manual_seed(s);
    return s;
  }();
  return seed;
}

at::Tensor randomInput(at::IntArrayRef sizes, loom_dtype dtype, double scale) {
  testSeed();
  at::Tensor t = at::randn(sizes) * scale;
  return dtype == LOOM_DTYPE_BF16 ? t.to(at::kBFloat16) : t;
}

Tolerance tolerance(loom_dtype dtype, double termScale) {
  const double rtol = dtype == LOOM_DTYPE_BF16 ? 1e-2 : 1e-6;
  return {rtol, rtol * termScale};
}

void requireClose(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol, const std::string& what,
                  const at::Tensor& terms) {
  INFO(what << " (seed " << testSeed() << ")");
  REQUIRE(actual.sizes() == expected.sizes());
  const at::Tensor a = actual.to(at::kDouble).flatten(), e = expected.to(at::kDouble).flatten();
  if (a.numel() == 0) return;
  at::Tensor bound = tol.rtol * e.abs() + tol.atol;
  if (terms.defined()) bound = bound + tol.rtol * terms.to(at::kDouble).flatten();
  const at::Tensor excess = (a - e).abs() - bound;
  const int64_t worst = excess.argmax().item<int64_t>();
  const double over = excess[worst].item<double>();
  // NaN anywhere fails, as does any element past its bound.
  const bool nan = a.isnan().any().item<bool>() != e.isnan().any().item<bool>();
  std::ostringstream msg;
  msg << "worst element " << worst << " of " << a.numel() << ": " << a[worst].item<double>() << " vs reference "
      << e[worst].item<double>() << " (|diff| " << std::abs(a[worst].item<double>() - e[worst].item<double>())
      << ", rtol " << tol.rtol << ", atol " << tol.atol << (terms.defined() ? " + rtol * terms" : "") << ")";
  INFO(msg.str());
  CHECK_FALSE(nan);
  CHECK(over <= 0.0);
}

}  // namespace loom::testing
