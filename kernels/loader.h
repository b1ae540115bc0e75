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

// Opens one plugin: dlopen, the entry symbol, the ABI version (refused with both versions and
// the file named), the table's header fields, then init(host). The library stays loaded for
// the life of the process.
StatusOr<const loom_kernel_table*> openPlugin(const std::string& path, const loom_kernel_host* host);

// Every plugin on pluginFiles(requested, getenv("LOOM_KERNEL_PATH")), added to `registry` in
// that order. Stops at the first plugin that cannot be loaded: a plugin the job asked for and
// did not get is an error, not a slower run.
Status loadPlugins(KernelRegistry& registry, const std::vector<std::string>& requested, const loom_kernel_host* host);

}  // namespace loom::kernels
