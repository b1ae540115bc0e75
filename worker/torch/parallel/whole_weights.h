#pragma once

#include "common/status.h"
#include "worker/torch/checkpoint/safetensors.h"
#include "worker/torch/model/decoder_model.h"

namespace loom::worker {

// The whole HF tensors from this rank's pieces (`pieces` by HF name, in this rank's shapes, as the
// ZeRO engine's fullWeights gives them): each tensor-parallel parameter is all-gathered over the
// model's tensor-parallel group, one tensor at a time, and put together as the Plan split it.
// Every rank of the group calls it.
StatusOr<TensorMap> wholeWeights(const DecoderModel& model, const TensorMap& pieces);

}  // namespace loom::worker
