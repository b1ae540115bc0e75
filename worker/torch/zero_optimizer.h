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

// The gradient, reduction and optimizer half of a training step, over the data-parallel group,
// by ZeRO stage (DeepSpeed's stage_1_and_2 semantics):
// - stage 0: every rank keeps the whole gradient (all-reduced, averaged) and the whole optimizer.
// - stage 1: the parameters are laid end to end in one flat buffer, cut into dp equal partitions
//   (planner/zero_partition.h); each rank keeps the fp32 masters and optimizer state of its own
//   partition only. The whole gradient is reduce-scattered at the end of the step, each rank
//   updates its partition, and the updated partitions are all-gathered into every rank's model.
// - stage 2: as 1, and each micro-batch's gradient is reduce-scattered (in reduce_bucket_size
//   buckets) into the rank's partition right after its backward, so only 1/dp of the gradient
//   is kept across micro-batches.
// The result is the same at every stage up to float summation order.
class ZeroOptimizer {
 public:
  // `params`: the model's parameters (leaves, in the model's dtype), named. `comm`: the
  // data-parallel group, or null for one rank.
  ZeroOptimizer(const planner::DeepSpeedConfig& config, std::vector<std::pair<std::string, at::Tensor>> params,
                backends::Communicator* comm);

  // Before the first micro-batch of a step.
  void zeroGradients();
  // After each micro-batch's backward: takes the parameters' gradients into this rank's buffer
  // (stage 2: reduced into its partition) and frees them.
  Status accumulate();
  // At the end of the step: averages over the ranks (if not done), divides by `lossScale`, and
  // returns the global gradient norm (not finite when a gradient overflowed).
  StatusOr<double> reduce(double lossScale);
  // Scales the gradient by `clipCoefficient` (<= 1), runs the optimizer on this rank's part with
  // `lr`, and brings every rank's model up to date.
  Status step(double lr, double clipCoefficient);

  int stage() const { return stage_; }
  // This rank's optimizer state and fp32 masters: whole-model names at stage 0
  // ("<param>.exp_avg", "master.<param>"), the rank's partition at stages 1 and 2
  // ("partition.exp_avg", "master.partition").
  TensorMap state() const;
  Status restore(const TensorMap& state, const std::string& source);
  ZeroMemory memory() const;

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
