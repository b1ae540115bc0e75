#include "worker/torch/model/kernels.h"

#include <dlfcn.h>

#include <filesystem>

#include "kernels/loader.h"
#include "kernels/reference/reference_table.h"
#include "worker/torch/model/plugin_ops.h"

namespace loom::worker {
namespace {

kernels::KernelRegistry& registry() {
  static kernels::KernelRegistry r;
  return r;
}

// The CPU plugin built with this library (beside it in lib/), or "" when it was not built.
std::string bundledCpuPlugin() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&bundledCpuPlugin), &info) == 0 || !info.dli_fname) return "";
  const auto path = std::filesystem::path(info.dli_fname).parent_path() / "libloom_kernels_cpu.so";
  return std::filesystem::exists(path) ? path.string() : "";
}

}  // namespace

Status loadKernels(const planner::JobSpec& spec) {
  static bool loaded = false;
  if (loaded) return Status::ok();
  loaded = true;
  static const loom_kernel_host host = kernels::reference::atenKernelHost();
  // The job names its plugins; the files come from the node's kernel directories only.
  std::vector<std::string> requested;
  const std::vector<std::string> dirs = kernels::kernelDirectories();
  for (const std::string& name : spec.kernelPlugins) {
    auto file = kernels::findPlugin(name, dirs);
    if (!file.isOk()) return file.status().withContext("kernels.plugins");
    requested.push_back(std::move(file).value());
  }
  // ZeRO-Offload steps the optimizer on the host: on the CPU plugin, as DeepSpeed steps on its
  // CPU Adam, without the job having to name it (after the job's own plugins).
  if (spec.deepspeed.zero.offloadOptimizer == "cpu") {
    if (std::string cpu = bundledCpuPlugin(); !cpu.empty()) requested.push_back(cpu);
  }
  RETURN_IF_ERROR(kernels::loadPlugins(registry(), requested, &host).withContext("kernels.plugins"));
  registry().addReference(kernels::reference::referenceKernelTable());
  usePluginOps(registry());
  return Status::ok();
}

const kernels::KernelRegistry& kernelRegistry() { return registry(); }

}  // namespace loom::worker
