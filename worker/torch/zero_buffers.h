#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "worker/torch/optimizer.h"
#include "worker/torch/safetensors.h"

namespace loom::worker {

// Small helpers the ZeRO stages share.

// The parameters the optimizer updates: those that require a gradient (train.frozen_parameters
// do not), in the model's order.
std::vector<std::pair<std::string, at::Tensor>> trainableOnly(const std::vector<std::pair<std::string, at::Tensor>>& params);

// Views of `flat` shaped like `params`, end to end from `offset`.
std::vector<at::Tensor> viewsInto(const at::Tensor& flat, const std::vector<std::pair<std::string, at::Tensor>>& params,
                                  int64_t offset = 0);
int64_t bytesOf(const at::Tensor& t);
// An uninitialized buffer of `numel` elements for `comm`'s collectives: on the host, from the
// communicator's allocate() (memory every rank of the host maps, which collectives read and
// write in place); elsewhere, or without a communicator, an ordinary tensor.
at::Tensor collectiveBuffer(backends::Communicator* comm, int64_t numel, const at::TensorOptions& options);
// The bytes of an optimizer's state tensors (its step count aside).
int64_t stateBytes(const Optimizer& optimizer);
// Collective failures inside autograd (a backward hook) travel as exceptions; the runtime turns
// them back into a Status at the job's edge (worker/torch/runtime.cc).
void throwIfError(const Status& status);
// Copies state[key] into `into`, which it must match in elements; errors name `source` and key.
Status restoreTensor(const TensorMap& state, const std::string& key, at::Tensor& into, const std::string& source);

}  // namespace loom::worker
