#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "client/loomctl/commands.h"
#include "kernels/loader.h"
#include "planner/job_spec.h"

namespace loom::loomctl {
namespace {

struct LoadedPlugin {
  std::string file;
  const loom_kernel_table* table;
  std::vector<std::string> ops;
};

// The plugins a rank on this machine would load, in the worker's order: the requested files
// (the command line's, then the spec's kernels.plugins found in the kernel directories), then
// LOOM_KERNEL_PATH's.
StatusOr<std::vector<LoadedPlugin>> loadAll(const std::vector<std::string>& requested) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, kernels::pluginFiles(requested, std::getenv("LOOM_KERNEL_PATH"), "the command line or --spec"));
  std::vector<LoadedPlugin> out;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(const loom_kernel_table* table, kernels::openPlugin(file, nullptr));
    LoadedPlugin p{file, table, {}};
    for (const kernels::OpSlot& slot : kernels::opSlots())
      if (kernels::provides(*table, slot.offset)) p.ops.push_back(slot.name);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

int kernelsCommand(const GlobalOptions& g, const std::vector<std::string>& files, const std::string& specFile) {
  std::vector<std::string> requested = files;
  if (!specFile.empty()) {
    auto text = readSpecFile(specFile);
    if (!text.isOk()) return reportError(text.status());
    auto spec = planner::parseJobSpec(*text, planner::SpecPurpose::kPlan);
    if (!spec.isOk()) return reportError(spec.status().withContext(specFile));
    // Looked up as a rank on this machine would: by name, in the kernel directories.
    for (const std::string& name : spec->kernelPlugins) {
      auto file = kernels::findPlugin(name, kernels::kernelDirectories());
      if (!file.isOk()) return reportError(file.status().withContext(specFile + ": kernels.plugins"));
      requested.push_back(std::move(file).value());
    }
  }
  auto plugins = loadAll(requested);
  if (!plugins.isOk()) return reportError(plugins.status());

  const size_t allOps = kernels::opSlots().size();
  if (g.format == OutputFormat::kJson) {
    nlohmann::ordered_json j;
    j["abi_version"] = LOOM_KERNEL_ABI_VERSION;
    j["plugins"] = nlohmann::ordered_json::array();
    for (const LoadedPlugin& p : *plugins)
      j["plugins"].push_back({{"file", p.file},
                              {"name", p.table->name},
                              {"device", p.table->device},
                              {"isa", p.table->isa ? p.table->isa : ""},
                              {"ops", p.ops}});
    std::puts(j.dump().c_str());
    return 0;
  }
  std::printf("kernel ABI %u\n", LOOM_KERNEL_ABI_VERSION);
  if (plugins->empty()) std::puts("no plugins (LOOM_KERNEL_PATH is empty and none was named)");
  for (const LoadedPlugin& p : *plugins) {
    std::printf("%s [%s, %s]: %zu of %zu ops, %s\n", p.table->name, p.table->device, p.table->isa ? p.table->isa : "?",
                p.ops.size(), allOps, p.file.c_str());
    std::printf("  %s\n", fmt::format("{}", fmt::join(p.ops, ", ")).c_str());
  }
  std::puts("loom-worker's libtorch reference runs every op that no plugin provides for the device.");
  return 0;
}

}  // namespace loom::loomctl
