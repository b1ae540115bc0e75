#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/optim/optimizer.h"
#include "worker/torch/checkpoint/safetensors.h"
#include "worker/torch/parallel/throw_if_error.h"

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
// The dtype gradients are reduced in over the data-parallel group: fp32, or under sequence
// parallelism deepspeed.seq_parallel_communication_data_type (stages 0 and 3, as DeepSpeed's
// engine and stage 3 use it; its stages 1 and 2 reduce in fp32 whenever sp > 1, and so do ours).
at::ScalarType gradientWireType(const planner::DeepSpeedConfig& config, const DecoderModel& model);
// The bytes of an optimizer's state tensors (its step count aside).
int64_t stateBytes(const Optimizer& optimizer);
// How much of a gradient's squared norm this rank counts, so that a sum over the tensor-parallel
// group counts every distinct piece once (DeepSpeed's global norm counts TP-sharded gradients
// once): 1 for a piece no other rank holds, 1 / replicas for a KV head shared by `replicas`
// ranks, 1 / tp for a whole parameter every rank of the group holds alike.
double tensorParallelNormWeight(const ShardLayout& layout, int tp);
// The norm weight of each parameter of `model` that requires a gradient, in the model's order.
std::vector<double> trainableNormWeights(const DecoderModel& model);
// ||flat||^2 as a float64 tensor [1] on flat's device: the norms of chunks of 2^16 elements,
// squared and summed in float64. One fp32 reduction over millions of gradients loses digits
// (1e-5 relative at a few hundred thousand), which the gradient norm and its clipping would carry.
at::Tensor flatSquares(const at::Tensor& flat);
// sum_i weights[i] * ||pieces[i]||^2, as a float64 tensor [1] on `options`' device.
at::Tensor weightedSquares(const std::vector<at::Tensor>& pieces, const std::vector<double>& weights,
                           const at::TensorOptions& options);
// Sums `squares` (float64 [1]) over `group` in place.
Status sumOver(backends::Communicator& group, at::Tensor& squares, const char* what);

// Copies state[key] into `into`, which it must match in elements; errors name `source` and key.
Status restoreTensor(const TensorMap& state, const std::string& key, at::Tensor& into, const std::string& source);

}  // namespace loom::worker
