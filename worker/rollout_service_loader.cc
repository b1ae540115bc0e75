// The worker's side of libloom_rollout_service.so (worker/rollout_service.h): loading it.
#include <mutex>

#include "worker/rollout_service.h"
#include "worker/sibling_library.h"

namespace loom::worker {

StatusOr<StartRolloutServiceFn> loadRolloutService() {
  static std::once_flag once;
  static StatusOr<StartRolloutServiceFn> loaded = Status(StatusCode::kInternal, "not loaded");
  std::call_once(once, [] {
    auto entry = loadSiblingEntry("LOOM_ROLLOUT_SERVICE", "libloom_rollout_service.so", "loom_rollout_service",
                                  "the rollout service");
    if (!entry.isOk()) {
      loaded = entry.status();
      return;
    }
    loaded = reinterpret_cast<StartRolloutServiceFn (*)()>(*entry)();
  });
  return loaded;
}

}  // namespace loom::worker
