#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/loom_kernel_abi.h"
#include "kernels/registry.h"

namespace loom::kernels {

// Where plugins come from, in order: the caller's list (a job spec's), then the entries of
// LOOM_KERNEL_PATH (colon-separated; `environment` is its value, may be null). An entry is a
// plugin file or a directory, whose libloom_kernels_*.so files are taken in name order. An entry
// that does not exist is an error naming it and where it came from (`requestedBy` for the
// caller's list); a file reached twice is loaded once.
StatusOr<std::vector<std::string>> pluginFiles(const std::vector<std::string>& requested, const char* environment,
                                               const char* requestedBy = "the job spec");

// The operator's kernel directories on this node, where a job's plugins are looked up by name
// (plugin_name.h): LOOM_KERNEL_DIRS (colon-separated; loomd sets it for its ranks from
// --kernel-dir), else defaultKernelDirectories().
std::vector<std::string> kernelDirectories();
// Beside the running binary: ../lib/kernels (the image's) and ../lib (a build tree's).
std::vector<std::string> defaultKernelDirectories();
// The file of the plugin `name` ("cuda" or "libloom_kernels_cuda.so") in the first of `dirs` that
// has it. A path, or a name no directory holds, is refused naming the directories.
StatusOr<std::string> findPlugin(const std::string& name, const std::vector<std::string>& dirs);

// Opens one plugin: dlopen, the entry symbol, the ABI version (refused with both versions and
// the file named), the table's header fields, then init(host). The library stays loaded for
// the life of the process.
StatusOr<const loom_kernel_table*> openPlugin(const std::string& path, const loom_kernel_host* host);

// Every plugin on pluginFiles(requested, getenv("LOOM_KERNEL_PATH")), added to `registry` in
// that order. Stops at the first plugin that cannot be loaded: a plugin the job asked for and
// did not get is an error, not a slower run.
Status loadPlugins(KernelRegistry& registry, const std::vector<std::string>& requested, const loom_kernel_host* host);

}  // namespace loom::kernels
