#pragma once

// Shared by the CPU kernel conformance tests: the CPU plugin under test (loaded through the
// loader) and its instruction-set paths. Random inputs and the comparison with the reference are
// in kernel_compare.h.

#include <string>
#include <vector>

#include "kernels/loom_kernel_abi.h"
#include "tests/conformance/kernel_compare.h"

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

}  // namespace loom::testing
