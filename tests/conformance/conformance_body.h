#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"

namespace loom::conformance {

// The one test body every Communicator runs (as ggml's test-backend-ops does for kernels):
// every collective, dtypes fp32 / bf16 / fp16 / int64, uneven sizes, misuse, on `device`.
// Values are small integers, exact in every dtype, so results compare exactly. Returns the
// number of failed checks; each is printed as "FAIL ...".
int runAll(backends::Communicator& world, at::Device device);

}  // namespace loom::conformance
