#include "worker/torch/kernels.h"

#include "kernels/loader.h"
#include "kernels/reference/reference_table.h"
#include "worker/torch/plugin_ops.h"

namespace loom::worker {
namespace {

kernels::KernelRegistry& registry() {
  static kernels::KernelRegistry r;
  return r;
}

}  // namespace

Status loadKernels(const planner::JobSpec& spec) {
  static bool loaded = false;
  if (loaded) return Status::ok();
  loaded = true;
  static const loom_kernel_host host = kernels::reference::atenKernelHost();
  RETURN_IF_ERROR(kernels::loadPlugins(registry(), spec.kernelPlugins, &host).withContext("kernels.plugins"));
  registry().addReference(kernels::reference::referenceKernelTable());
  usePluginOps(registry());
  return Status::ok();
}

const kernels::KernelRegistry& kernelRegistry() { return registry(); }

}  // namespace loom::worker
