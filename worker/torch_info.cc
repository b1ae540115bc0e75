#include "worker/torch_info.h"

#include <ATen/Parallel.h>
#include <torch/version.h>

// Torch-facing files use no fmt: the torch wheel ships fmt headers of another version, which
// would shadow Debian's on this target's include path.
namespace loom::worker {

std::string torchInfo() {
  return std::string("torch ") + TORCH_VERSION + ", " + std::to_string(at::get_num_threads()) + " threads";
}

}  // namespace loom::worker
