#pragma once

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "worker/torch/model/decoder_model.h"

namespace loom::worker {

// The whole HF tensor of model parameter `parameter` from this rank's piece of it (in this rank's
// shape): a tensor-parallel parameter is all-gathered over the model's tensor-parallel group and
// put together as the Plan split it; a whole one is returned as it is. Every rank of the group
// calls it for the same parameters in the same order.
StatusOr<at::Tensor> wholeParameter(const DecoderModel& model, int parameter, const at::Tensor& piece);

}  // namespace loom::worker
