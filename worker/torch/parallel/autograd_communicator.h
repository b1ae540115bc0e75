#pragma once

#include <cstdint>

#include <torch/csrc/autograd/custom_function.h>

#include "backends/communicator.h"

namespace loom::worker {

// Autograd keeps a function's non-tensor state in IValues: the communicator of a collective's
// autograd function travels to its backward as its address.
inline void keepCommunicator(torch::autograd::AutogradContext* ctx, backends::Communicator& comm) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
}
inline backends::Communicator& communicatorOf(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<backends::Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

}  // namespace loom::worker
