/* A plugin the loader must refuse, built twice by tests/CMakeLists.txt: with
 * LOOM_BAD_PLUGIN_NO_SYMBOL it exports no loom_kernel_plugin at all; without, it reports ABI
 * version 999. */
#include "kernels/loom_kernel_abi.h"

#ifndef LOOM_BAD_PLUGIN_NO_SYMBOL
static const loom_kernel_table kTable = {
    .abi_version = 999,
    .struct_size = sizeof(loom_kernel_table),
    .name = "bad-abi",
    .device = "cpu",
    .isa = "none",
};

LOOM_KERNEL_EXPORT const loom_kernel_table* loom_kernel_plugin(void) { return &kTable; }
#else
LOOM_KERNEL_EXPORT int not_a_kernel_plugin(void) { return 0; }
#endif
