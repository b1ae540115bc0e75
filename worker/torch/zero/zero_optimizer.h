#pragma once

#include <memory>
#include <string>

#include "backends/communicator.h"
#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/plan.h"
#include "worker/optim/lr_schedule.h"
#include "worker/torch/checkpoint/safetensors.h"

namespace loom::worker {

class DecoderModel;

// Bytes this rank holds for training state, by kind (reported as job metrics).
struct ZeroMemory {
  int64_t parameterBytes = 0;  // the model's parameters, plus the fp32 masters this rank keeps
  int64_t gradientBytes = 0;   // gradient buffers kept across micro-batches
  int64_t optimizerStateBytes = 0;
};

// The gradient, reduction and optimizer half of a training step over the data-parallel group, by
// ZeRO stage (worker/torch/zero_stage*.h). The result is the same at every stage up to float
// summation order.
class ZeroEngine {
 public:
  virtual ~ZeroEngine() = default;
  // Before the first micro-batch of a step.
  virtual void zeroGradients() = 0;
  // After each micro-batch's backward: takes what is left of the parameters' gradients.
  virtual Status accumulate() = 0;
  // At the end of the step: averages over the ranks (if not done) and returns the global norm of
  // the gradient divided by `lossScale` (not finite when a gradient overflowed). The buffers keep
  // the scaled gradient: step() divides as the optimizer reads it.
  virtual StatusOr<double> reduce(double lossScale) = 0;
  // Runs the optimizer on this rank's part with `lr`, on the gradient divided by the loss scale and
  // multiplied by `clipCoefficient` (<= 1), and brings every rank's model up to date. Under Muon,
  // reduce() has already turned its matrices' gradients into their updates (optim/muon.h), so the
  // norm it returns covers those, as DeepSpeed's does.
  virtual Status step(const train::LearningRates& lr, double clipCoefficient) = 0;
  // This rank's optimizer state and fp32 masters (what its checkpoint file holds).
  virtual TensorMap state() const = 0;
  // Without `optimizerState`, the fp32 masters (and stage 3's frozen weights) only: the
  // optimizer starts afresh (train.resume_optimizer false).
  virtual Status restore(const TensorMap& state, const std::string& source, bool optimizerState) = 0;
  virtual ZeroMemory memory() const = 0;
  // This rank's weights of model parameter `parameter` (its tensor-parallel piece, in this rank's
  // shape). Every rank of the data-parallel group calls it for the same parameters in the same
  // order: stage 3 gathers the parameter's parts.
  virtual StatusOr<at::Tensor> weightPiece(int parameter) = 0;
};

// The groups a ZeRO engine works over (null where a job has one rank). Dense gradients are
// averaged over `dense` (dp x sp) and partitioned there. An expert's gradient arrives at the rank
// that holds it from every rank of its expert-parallel group (the dispatch's backward), so it is
// summed over `expertData` (dp x sp / ep, the ranks holding the same experts), partitioned there,
// and divided by the dense group's size: the mean over all the step's samples, as on one rank.
// The gradient norm counts each expert once: its squares are summed over `expert`.
struct ZeroGroups {
  backends::Communicator* dense = nullptr;
  backends::Communicator* expertData = nullptr;
  backends::Communicator* expert = nullptr;
};

// The engine for config.zero.stage over the data-parallel group `comm`, with the partitions the
// Plan laid out (its flat buffers at stages 1 and 2, each parameter's part at stage 3). Stages 2
// and 3 take over running the model's blocks, to act inside its backward.
// The Plan's ZeRO layout must fit this group and model before an engine trusts it: the stage and
// group size, and at stages 1-2 every parameter that trains in exactly one flat buffer and nothing
// else there (a Plan stored by another version could disagree on the frozen set).
// FailedPrecondition naming what differs.
Status checkZeroPlan(const planner::DeepSpeedConfig& config, const planner::Plan& plan, const DecoderModel& model,
                     const backends::Communicator& dp);

std::unique_ptr<ZeroEngine> makeZeroEngine(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                           DecoderModel& model, const ZeroGroups& groups);

}  // namespace loom::worker
