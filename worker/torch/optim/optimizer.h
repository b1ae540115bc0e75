#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "worker/optim/lr_schedule.h"
#include "worker/torch/checkpoint/safetensors.h"

namespace loom::worker {

// DeepSpeed's optimizers over fp32 master weights, updated in place:
// - AdamW / Adam: moments m, v; bias correction unless disabled; decoupled weight decay
//   (p -= lr * wd * p) or, for Adam with adam_w_mode false, L2 (g += wd * p). The same update
//   as torch.optim.AdamW / Adam.
// - Lion: p -= lr * (sign(b1 m + (1 - b1) g) + wd p); m = b2 m + (1 - b2) g.
// - Adagrad: g += wd * p; s += g^2; p -= lr * g / (sqrt(s) + eps).
// - Muon: its matrices' slots take the update MuonUpdater (muon.h) left in their gradient:
//   p -= lr * wd * p; p -= lr * update; every other slot takes the auxiliary AdamW.
// Every parameter gets the configured weight decay, as when DeepSpeed builds the optimizer
// from its config. What each slot keeps is its rule's (planner/optimizer_rules.h).
class Optimizer {
 public:
  // `muon[i]`: masters[i] is (a piece of) a Muon matrix; empty: none is.
  Optimizer(const planner::OptimizerConfig& config, std::vector<std::pair<std::string, at::Tensor>> masters,
            std::vector<bool> muon = {});

  // One update with learning rates `lr`; grads[i] belongs to masters[i] (fp32, same shape). The
  // update uses grads[i] / gradDivisor (the loss scale over the clipping coefficient): inside the
  // fused kernel where there is one, else by dividing the grads in place first.
  void step(const train::LearningRates& lr, const std::vector<at::Tensor>& grads, double gradDivisor = 1.0);
  int64_t steps() const { return steps_; }

  // The same update taken in pieces, for ZeRO-Offload's pipeline (worker/torch/zero/host_step.h):
  // beginStep() once, then stepPiece() for pieces that together cover every slot once. A piece
  // is `grad.numel()` elements of slot `slot`'s flat tensors from `offset`.
  void beginStep() { ++steps_; }
  void stepPiece(const train::LearningRates& lr, size_t slot, int64_t offset, const at::Tensor& grad);
  // Slot `slot`'s fp32 master, flat (the masters' order of the constructor).
  at::Tensor master(size_t slot) const { return slots_[slot].param.view(-1); }
  // A Muon slot's momentum, flat.
  at::Tensor momentum(size_t slot) const { return slots_[slot].first.view(-1); }

  // Per slot, its rule's state names: "<param>.exp_avg", "<param>.exp_avg_sq" (Adam),
  // "<param>.exp_avg" (Lion), "<param>.sum" (Adagrad), "<param>.momentum_buffer" (a Muon
  // matrix); and "step".
  TensorMap state() const;
  // Restores what state() returned; errors name the missing or misshapen tensor.
  Status restore(const TensorMap& state, const std::string& source);

 private:
  struct Slot {
    std::string name;
    at::Tensor param;
    at::Tensor first, second;  // exp_avg / exp_avg_sq, or exp_avg (Lion), or sum (Adagrad), or Muon's momentum
    at::Tensor step;           // Adam/AdamW: the step count as the fused kernel keeps it (fp32)
    bool muon = false;
  };
  // One update of `slots` (the optimizer's, or pieces of them) with grads[i] for slots[i].
  void apply(std::vector<Slot>& slots, const train::LearningRates& lr, const std::vector<at::Tensor>& grads,
             double gradDivisor);
  // The elementwise optimizer's update of `slots` (none of them Muon's).
  void applyElementwise(std::vector<Slot>& slots, double lr, const std::vector<at::Tensor>& grads, double gradDivisor);
  // Adam and AdamW with bias correction: libtorch's fused kernel (torch.optim's fused=True), one
  // pass over each tensor instead of seven.
  bool fused(const std::vector<Slot>& slots) const;
  void fusedAdamStep(std::vector<Slot>& slots, double lr, const std::vector<at::Tensor>& grads, double gradDivisor);
  // On the CPU, a loaded kernel plugin's step (kernels/), when one provides this optimizer.
  bool pluginServes(const std::vector<Slot>& slots) const;
  bool pluginStep(const std::vector<Slot>& slots, double lr, const std::vector<at::Tensor>& grads);
  const std::vector<std::string>& stateNames(const Slot& slot) const;

  planner::OptimizerConfig config_;
  planner::OptimizerConfig elementwise_;  // config_.auxiliary(): what the non-Muon slots run
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
};

}  // namespace loom::worker
