#include "worker/torch_runtime.h"

#include <cstdlib>
#include <mutex>

#include <dlfcn.h>

#include "common/files.h"

namespace loom::worker {

StatusOr<TorchRuntime*> loadTorchRuntime() {
  static std::once_flag once;
  static StatusOr<TorchRuntime*> loaded = Status(StatusCode::kInternal, "not loaded");
  std::call_once(once, [] {
    const char* env = std::getenv("LOOM_TORCH_RUNTIME");
    std::string path = env && *env ? env : files::selfDir() + "/../lib/libloom_torch.so";
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      loaded = Status(StatusCode::kFailedPrecondition, std::string("cannot load the torch runtime: ") + ::dlerror());
      return;
    }
    auto entry = reinterpret_cast<TorchRuntime* (*)()>(::dlsym(handle, "loom_torch_runtime"));
    if (!entry) {
      loaded = Status(StatusCode::kFailedPrecondition, path + " has no symbol loom_torch_runtime");
      return;
    }
    loaded = entry();
  });
  return loaded;
}

}  // namespace loom::worker
