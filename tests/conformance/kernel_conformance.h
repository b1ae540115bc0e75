#pragma once

// Shared by the kernel conformance tests: the CPU plugin under test (loaded through the loader),
// its instruction-set paths, fresh random inputs, and the per-op comparison with the reference.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "kernels/loom_kernel_abi.h"

namespace loom::testing {

// The CPU plugin's table, loaded once per process from LOOM_CPU_PLUGIN_PATH (the build's).
const loom_kernel_table& cpuPlugin();
// The libtorch reference's table.
const loom_kernel_table& referenceTable();

// How to run the plugin in one pass of a test: an instruction set and whose threads.
struct PluginSetup {
  std::string isa;   // "avx512", "avx2", "scalar"
  bool atenThreads;  // libtorch's (at::parallel_for) rather than the plugin's own pool
  std::string label() const { return isa + (atenThreads ? " on libtorch threads" : " on its own threads"); }
};
// Every instruction set this processor has, best first, on the plugin's own 2 threads; then the
// best on libtorch's threads.
std::vector<PluginSetup> pluginSetups();
// Re-initializes the plugin for `setup` (init may be called again between ops).
void configurePlugin(const PluginSetup& setup);

// The seed of this process's random inputs: LOOM_TEST_SEED if set, else fresh; printed once.
uint64_t testSeed();
// randn in fp32, then cast: both implementations get the same values in `dtype`.
at::Tensor randomInput(at::IntArrayRef sizes, loom_dtype dtype, double scale = 1.0);

// |actual - expected| <= rtol * |expected| + atol, element by element (both read as fp64).
struct Tolerance {
  double rtol;
  double atol;
};
// The tolerance of an op for `dtype`: fp32 1e-6 relative, bf16 1e-2 relative. `termScale` is the
// magnitude of the terms the result is summed or differenced from (e.g. the largest |input| of a
// rotation): where the result cancels, the rounding error is relative to the terms, not to the
// result, so an absolute part of rtol * termScale is the same bound written for such elements.
Tolerance tolerance(loom_dtype dtype, double termScale);
// Checks, and on failure reports the worst element with both values, the tolerance and `what`.
// `terms` (optional, the shape of `expected`) adds rtol * terms element by element: the size of
// the terms each element was computed from, where that is known per element.
void requireClose(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol, const std::string& what,
                  const at::Tensor& terms = {});

inline const char* dtypeName(loom_dtype dtype) { return dtype == LOOM_DTYPE_BF16 ? "bf16" : "fp32"; }

}  // namespace loom::testing
