#pragma once

#include "kernels/loom_kernel_abi.h"

namespace loom::kernels::reference {

// The libtorch reference (reference_ops.h) behind the plugin ABI: name "reference", device
// "cpu", isa "libtorch", every op. The host adds it with KernelRegistry::addReference, so every
// op has an implementation; the conformance tests call it through the same table as a plugin.
// It refuses amsgrad (LOOM_KERNEL_UNSUPPORTED, "amsgrad is not supported").
const loom_kernel_table* referenceKernelTable();

// A host for plugins in a process that runs libtorch: parallel_for is at::parallel_for, so a
// plugin's ops run on libtorch's intra-op threads instead of competing with them.
loom_kernel_host atenKernelHost();

}  // namespace loom::kernels::reference
