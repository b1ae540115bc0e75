#pragma once

#include "common/status.h"
#include "kernels/registry.h"
#include "planner/job_spec.h"

namespace loom::worker {

// This rank's kernel implementations: the plugins the job names (kernels.plugins) and
// LOOM_KERNEL_PATH's, then the libtorch reference. With offload_optimizer.device cpu, the CPU
// plugin built beside libloom_torch.so joins after the job's own, for the host's optimizer step. Loaded once per process, after libtorch's
// thread count is set (the plugins run on libtorch's threads); the model's ops then call the
// plugins that provide them (worker/torch/model/plugin_ops.h).
Status loadKernels(const planner::JobSpec& spec);
const kernels::KernelRegistry& kernelRegistry();

}  // namespace loom::worker
