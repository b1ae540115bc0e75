#include "tests/conformance/kernel_conformance.h"

#include <cstdio>
#include <cstdlib>

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

}  // namespace loom::testing
