#include "kernels/loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "kernels/plugin_name.h"

namespace loom::kernels {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> splitPath(const char* value) {
  std::vector<std::string> out;
  if (!value) return out;
  std::string_view rest(value);
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    std::string_view entry = rest.substr(0, colon);
    if (!entry.empty()) out.emplace_back(entry);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return out;
}

bool isPluginName(const std::string& name) {
  return name.rfind("libloom_kernels_", 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0;
}

// The plugin files an entry stands for.
StatusOr<std::vector<std::string>> expand(const std::string& entry, const char* from) {
  std::error_code ec;
  const fs::file_status st = fs::status(entry, ec);
  if (ec || !fs::exists(st)) return notFound("kernel plugin path {} (from {}) does not exist", entry, from);
  if (!fs::is_directory(st)) return std::vector<std::string>{entry};
  std::vector<std::string> files;
  for (const auto& item : fs::directory_iterator(entry, ec))
    if (item.is_regular_file() && isPluginName(item.path().filename().string())) files.push_back(item.path().string());
  if (ec) return invalidArgument("kernel plugin directory {} (from {}): {}", entry, from, ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

StatusOr<std::vector<std::string>> pluginFiles(const std::vector<std::string>& requested, const char* environment,
                                               const char* requestedBy) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto addAll = [&](const std::vector<std::string>& entries, const char* from) -> Status {
    for (const std::string& entry : entries) {
      ASSIGN_OR_RETURN(std::vector<std::string> files, expand(entry, from));
      for (std::string& file : files) {
        std::error_code ec;
        const std::string canonical = fs::weakly_canonical(file, ec).string();
        if (seen.insert(ec ? file : canonical).second) out.push_back(std::move(file));
      }
    }
    return Status::ok();
  };
  RETURN_IF_ERROR(addAll(requested, requestedBy));
  RETURN_IF_ERROR(addAll(splitPath(environment), "LOOM_KERNEL_PATH"));
  return out;
}

std::vector<std::string> defaultKernelDirectories() {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return {};
  const fs::path lib = fs::path(std::string(exe, static_cast<size_t>(n))).parent_path().parent_path() / "lib";
  return {(lib / "kernels").string(), lib.string()};
}

std::vector<std::string> kernelDirectories() {
  const char* dirs = std::getenv("LOOM_KERNEL_DIRS");
  return dirs ? splitPath(dirs) : defaultKernelDirectories();
}

StatusOr<std::string> findPlugin(const std::string& name, const std::vector<std::string>& dirs) {
  std::string listed;
  for (const std::string& dir : dirs) listed += (listed.empty() ? "" : ", ") + dir;
  const std::string shortName = pluginShortName(name);
  if (shortName.empty())
    return invalidArgument("kernel plugin \"{}\" is not a plugin name: a job names one (\"cuda\" for "
                           "libloom_kernels_cuda.so), which loads from the node's kernel directories ({})",
                           name, listed);
  for (const std::string& dir : dirs) {
    const fs::path file = fs::path(dir) / pluginFileName(shortName);
    std::error_code ec;
    if (fs::is_regular_file(file, ec)) return file.string();
  }
  return notFound("kernel plugin \"{}\" ({}) is in none of this node's kernel directories ({}; loomd --kernel-dir)",
                  name, pluginFileName(shortName), listed.empty() ? "none" : listed);
}

StatusOr<const loom_kernel_table*> openPlugin(const std::string& path, const loom_kernel_host* host) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) return failedPrecondition("kernel plugin {}: cannot load it: {}", path, ::dlerror());
  // From here on the library stays loaded: unloading a library whose code may have started
  // threads, or whose table a caller kept, is not worth the risk for a failed load.
  auto entry = reinterpret_cast<loom_kernel_plugin_fn>(::dlsym(handle, LOOM_KERNEL_ENTRY_SYMBOL));
  if (!entry)
    return failedPrecondition("kernel plugin {}: no symbol {} (is it a Loom kernel plugin?)", path,
                              LOOM_KERNEL_ENTRY_SYMBOL);
  const loom_kernel_table* table = entry();
  if (!table) return failedPrecondition("kernel plugin {}: {}() returned no table", path, LOOM_KERNEL_ENTRY_SYMBOL);
  // Only the version is read before it is checked: the rest of the layout depends on it.
  if (table->abi_version != LOOM_KERNEL_ABI_VERSION)
    return failedPrecondition(
        "kernel plugin {} was built for kernel ABI version {}, but this Loom expects version {}: rebuild it "
        "against this Loom's kernels/loom_kernel_abi.h",
        path, table->abi_version, LOOM_KERNEL_ABI_VERSION);
  if (table->struct_size < offsetof(loom_kernel_table, rms_norm_forward))
    return failedPrecondition("kernel plugin {}: its table is {} bytes, too small for ABI version {}", path,
                              table->struct_size, LOOM_KERNEL_ABI_VERSION);
  if (!table->name || !*table->name) return failedPrecondition("kernel plugin {}: its table has no name", path);
  if (!table->device || (std::strcmp(table->device, "cpu") != 0 && std::strcmp(table->device, "cuda") != 0))
    return failedPrecondition("kernel plugin {} ({}): device {} is neither cpu nor cuda", path, table->name,
                              table->device ? table->device : "(null)");
  if (table->init) {
    const int rc = table->init(host);
    if (rc != LOOM_KERNEL_OK) {
      const char* why = table->last_error ? table->last_error() : nullptr;
      return failedPrecondition("kernel plugin {} ({}): init failed (status {}): {}", path, table->name, rc,
                                why && *why ? why : "no reason given");
    }
  }
  return table;
}

Status loadPlugins(KernelRegistry& registry, const std::vector<std::string>& requested, const loom_kernel_host* host) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, pluginFiles(requested, std::getenv("LOOM_KERNEL_PATH")));
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(const loom_kernel_table* table, openPlugin(file, host));
    registry.addPlugin(table, file);
  }
  return Status::ok();
}

}  // namespace loom::kernels
