#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/zero_partition.h"
#include "worker/torch/optimizer.h"
#include "worker/torch/safetensors.h"

namespace loom::worker {

// Bytes this rank holds for training state, by kind (reported as job metrics).
struct ZeroMemory {
  int64_t parameterBytes = 0;  // the model's parameters, plus the fp32 masters this rank keeps
  int64_t gradientBytes = 0;   // gradient buffers kept across micro-batches
  int64_t optimizerStateBytes = 0;
};

// The gradient, reduction and optimizer half of a training step over the data-parallel group, by
// ZeRO stage. The result is the same at every stage up to float summation order.
class ZeroEngine {
 public:
  virtual ~ZeroEngine() = default;
  // Before the first micro-batch of a step.
  virtual void zeroGradients() = 0;
  // After each micro-batch's backward.
  virtual Status accumulate() = 0;
  // At the end of the step: averages over the ranks (if not done), divides by `lossScale`, and
  // returns the global gradient norm (not finite when a gradient overflowed).
  virtual StatusOr<double> reduce(double lossScale) = 0;
  // Scales the gradient by `clipCoefficient` (<= 1), runs the optimizer on this rank's part with
  // `lr`, and brings every rank's model up to date.
  virtual Status step(double lr, double clipCoefficient) = 0;
  // This rank's optimizer state and fp32 masters (what its checkpoint file holds).
  virtual TensorMap state() const = 0;
  virtual Status restore(const TensorMap& state, const std::string& source) = 0;
  virtual ZeroMemory memory() const = 0;
  // The whole model's weights by HF name. Every rank calls it (stage 3 gathers them).
  virtual StatusOr<TensorMap> fullWeights() = 0;
};

class DecoderModel;
// The engine for config.zero.stage. Stage 3 takes over running the model's blocks.
std::unique_ptr<ZeroEngine> makeZeroEngine(const planner::DeepSpeedConfig& config, DecoderModel& model,
                                           backends::Communicator* comm);

// Stages 0, 1 and 2 (DeepSpeed's stage_1_and_2 semantics):
// - stage 0: every rank keeps the whole gradient (all-reduced, averaged) and the whole optimizer.
// - stage 1: the parameters are laid end to end in one flat buffer, cut into dp equal partitions
//   (planner/zero_partition.h); each rank keeps the fp32 masters and optimizer state of its own
//   partition only. The whole gradient is reduce-scattered at the end of the step, each rank
//   updates its partition, and the updated partitions are all-gathered into every rank's model.
// - stage 2: as 1, and each micro-batch's gradient is reduce-scattered (in reduce_bucket_size
//   buckets) into the rank's partition right after its backward, so only 1/dp of the gradient
//   is kept across micro-batches.
class ZeroOptimizer final : public ZeroEngine {
 public:
  // `params`: the model's parameters (leaves, in the model's dtype), named. `comm`: the
  // data-parallel group, or null for one rank.
  ZeroOptimizer(const planner::DeepSpeedConfig& config, std::vector<std::pair<std::string, at::Tensor>> params,
                backends::Communicator* comm);

  // Before the first micro-batch of a step.
  void zeroGradients() override;
  // Takes the parameters' gradients into this rank's buffer (stage 2: reduced into its
  // partition) and frees them.
  Status accumulate() override;
  StatusOr<double> reduce(double lossScale) override;
  Status step(double lr, double clipCoefficient) override;
  // Whole-model names at stage 0 ("<param>.exp_avg", "master.<param>"), the rank's partition at
  // stages 1 and 2 ("partition.exp_avg", "master.partition").
  TensorMap state() const override;
  Status restore(const TensorMap& state, const std::string& source) override;
  ZeroMemory memory() const override;
  StatusOr<TensorMap> fullWeights() override;

 private:
  Status reduceScatterInto(const at::Tensor& flat, at::Tensor& partition);
  at::Tensor flattenGradients() const;  // the parameters' gradients, end to end, fp32, padded

  const planner::DeepSpeedConfig& config_;
  int stage_;
  backends::Communicator* comm_;
  int dp_ = 1;
  int rank_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  planner::FlatPartition layout_;

  // stage 0: one fp32 buffer with a view per parameter; masters only under bf16 / fp16.
  at::Tensor gradFlat_;
  std::vector<at::Tensor> gradViews_;
  at::Tensor masterFlat_;
  std::vector<at::Tensor> masterViews_;
  // stages 1 and 2: this rank's partition.
  at::Tensor gradPartition_;
  at::Tensor masterPartition_;

  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace loom::worker
