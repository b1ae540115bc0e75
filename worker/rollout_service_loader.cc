// The worker's side of libloom_rollout_service.so (worker/rollout_service.h): loading it.
#include "worker/rollout_service.h"
#include "worker/sibling_library.h"

namespace loom::worker {

StatusOr<StartRolloutServiceFn> loadRolloutService() {
  static const StatusOr<StartRolloutServiceFn> loaded = callSiblingEntry<StartRolloutServiceFn>(
      "LOOM_ROLLOUT_SERVICE", "libloom_rollout_service.so", "loom_rollout_service", "the rollout service");
  return loaded;
}

}  // namespace loom::worker
