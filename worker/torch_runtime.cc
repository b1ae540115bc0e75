#include "worker/torch_runtime.h"

#include <mutex>

#include "worker/sibling_library.h"

namespace loom::worker {

StatusOr<TorchRuntime*> loadTorchRuntime() {
  static std::once_flag once;
  static StatusOr<TorchRuntime*> loaded = Status(StatusCode::kInternal, "not loaded");
  std::call_once(once, [] {
    auto entry = loadSiblingEntry("LOOM_TORCH_RUNTIME", "libloom_torch.so", "loom_torch_runtime", "the torch runtime");
    if (!entry.isOk()) {
      loaded = entry.status();
      return;
    }
    loaded = reinterpret_cast<TorchRuntime* (*)()>(*entry)();
  });
  return loaded;
}

}  // namespace loom::worker
