#include "worker/torch_runtime.h"

#include "worker/sibling_library.h"

namespace loom::worker {

StatusOr<TorchRuntime*> loadTorchRuntime() {
  static const StatusOr<TorchRuntime*> loaded = callSiblingEntry<TorchRuntime*>(
      "LOOM_TORCH_RUNTIME", "libloom_torch.so", "loom_torch_runtime", "the torch runtime");
  return loaded;
}

}  // namespace loom::worker
