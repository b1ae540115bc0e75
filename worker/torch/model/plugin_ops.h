#pragma once

#include <c10/core/Device.h>

#include "kernels/registry.h"

namespace loom::worker {

// Points the model's op table (worker/torch/model/ops.h) at the kernel plugins of `registry`:
// rms_norm, rope, swiglu, cross entropy and logprobs become autograd functions whose forward and
// backward call the plugin's slots. A call goes to a plugin only when one provides both of its
// slots on the tensors' device and the tensors are fp32 or bf16; anything else (fp16, a device no
// plugin serves) runs the libtorch reference, and so does a call every plugin refuses (a plugin
// built for another GPU architecture, a size it does not take).
// Call once, after the plugins are loaded and before the model runs; `registry` must outlive
// every op call.
void usePluginOps(const kernels::KernelRegistry& registry);

// Whether a loaded plugin provides rollout's paged decode attention on `device` (CUDA graphs of
// decode steps need it: the reference gathers whole block tables).
bool pluginPagedDecode(const c10::Device& device);

}  // namespace loom::worker
