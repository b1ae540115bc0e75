#pragma once

#include <stdexcept>

#include "common/status.h"

namespace loom::worker {

// Collective failures inside autograd (a backward, a hook) travel as exceptions; the runtime turns
// them back into a Status at the job's edge (worker/torch/runtime.cc).
inline void throwIfError(const Status& status) {
  if (!status.isOk()) throw std::runtime_error(status.toString());
}

}  // namespace loom::worker
