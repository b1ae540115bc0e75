#include "worker/torch/optim/optimizer.h"

#include <cmath>
#include <optional>

#include <ATen/ATen.h>

#include <ATen/core/grad_mode.h>

#include "planner/optimizer_rules.h"
#include "worker/torch/model/kernels.h"

namespace loom::worker {

using planner::OptimizerType;

Optimizer::Optimizer(const planner::OptimizerConfig& config, std::vector<std::pair<std::string, at::Tensor>> masters,
                     std::vector<bool> muon)
    : config_(config), elementwise_(config.auxiliary()) {
  for (size_t i = 0; i < masters.size(); ++i) {
    auto& [name, param] = masters[i];
    Slot slot{.name = name, .param = param, .muon = i < muon.size() && muon[i]};
    const size_t states = stateNames(slot).size();
    slot.first = at::zeros_like(param);
    if (states > 1) {
      slot.second = at::zeros_like(param);
      slot.step = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(param.device()));
    }
    slots_.push_back(std::move(slot));
  }
}

const std::vector<std::string>& Optimizer::stateNames(const Slot& slot) const {
  return planner::optimizerRule(config_, slot.muon).stateNames;
}

bool Optimizer::fused(const std::vector<Slot>& slots) const {
  return (elementwise_.type == OptimizerType::kAdam || elementwise_.type == OptimizerType::kAdamW) &&
         elementwise_.biasCorrection && !slots.empty() && slots.front().param.scalar_type() == at::kFloat;
}

void Optimizer::fusedAdamStep(std::vector<Slot>& slots, double lr, const std::vector<at::Tensor>& grads,
                              double gradDivisor) {
  std::vector<at::Tensor> params, firsts, seconds, steps;
  for (auto& s : slots) {
    params.push_back(s.param);
    firsts.push_back(s.first);
    seconds.push_back(s.second);
    // The kernel reads the step count for bias correction; torch.optim counts it up before.
    s.step.fill_(static_cast<double>(steps_));
    steps.push_back(s.step);
  }
  const auto& c = elementwise_;
  // The kernel divides each gradient by grad_scale as it reads it (AMP's unscale): clipping and
  // loss scaling cost no pass of their own over the gradients.
  std::optional<at::Tensor> gradScale;
  if (gradDivisor != 1.0) gradScale = at::full({}, gradDivisor, slots.front().param.options());
  if (c.decoupledWeightDecay) {
    at::_fused_adamw_(params, grads, firsts, seconds, /*max_exp_avg_sqs=*/{}, steps, lr, c.beta1, c.beta2,
                      c.weightDecay, c.eps, /*amsgrad=*/false, /*maximize=*/false, gradScale);
  } else {
    at::_fused_adam_(params, grads, firsts, seconds, {}, steps, lr, c.beta1, c.beta2, c.weightDecay, c.eps, false,
                     false, gradScale);
  }
}

bool Optimizer::pluginServes(const std::vector<Slot>& slots) const {
  const auto& registry = kernelRegistry();
  const auto& c = elementwise_;
  for (const auto& s : slots) {
    if (!s.param.is_cpu() || s.param.scalar_type() != at::kFloat || !s.param.is_contiguous()) return false;
  }
  const bool adam = c.type == OptimizerType::kAdam || c.type == OptimizerType::kAdamW;
  return !((adam && !registry.pluginProvides(&loom_kernel_table::adamw_step, "cpu")) ||
           (c.type == OptimizerType::kLion && !registry.pluginProvides(&loom_kernel_table::lion_step, "cpu")) ||
           (c.type == OptimizerType::kAdagrad && !registry.pluginProvides(&loom_kernel_table::adagrad_step, "cpu")));
}

bool Optimizer::pluginStep(const std::vector<Slot>& slots, double lr, const std::vector<at::Tensor>& grads) {
  if (!pluginServes(slots)) return false;
  const auto& registry = kernelRegistry();
  const auto& c = elementwise_;
  const bool adam = c.type == OptimizerType::kAdam || c.type == OptimizerType::kAdamW;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    at::Tensor g = grads[i].to(at::kFloat).contiguous();
    Status status;
    if (adam) {
      const loom_adam_config a{.lr = lr, .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps, .weight_decay = c.weightDecay,
                               .step = steps_, .bias_correction = c.biasCorrection,
                               .decoupled_weight_decay = c.decoupledWeightDecay, .amsgrad = 0};
      status = registry.call(&loom_kernel_table::adamw_step, "cpu", &a, LOOM_DTYPE_F32, s.param.data_ptr(),
                             LOOM_DTYPE_F32, static_cast<const void*>(g.data_ptr()), s.first.data_ptr<float>(),
                             s.second.data_ptr<float>(), s.param.numel(), static_cast<void*>(nullptr));
    } else if (c.type == OptimizerType::kLion) {
      const loom_lion_config l{.lr = lr, .beta1 = c.beta1, .beta2 = c.beta2, .weight_decay = c.weightDecay};
      status = registry.call(&loom_kernel_table::lion_step, "cpu", &l, LOOM_DTYPE_F32, s.param.data_ptr(),
                             LOOM_DTYPE_F32, static_cast<const void*>(g.data_ptr()), s.first.data_ptr<float>(),
                             s.param.numel(), static_cast<void*>(nullptr));
    } else {
      const loom_adagrad_config a{.lr = lr, .eps = c.eps, .weight_decay = c.weightDecay};
      status = registry.call(&loom_kernel_table::adagrad_step, "cpu", &a, LOOM_DTYPE_F32, s.param.data_ptr(),
                             LOOM_DTYPE_F32, static_cast<const void*>(g.data_ptr()), s.first.data_ptr<float>(),
                             s.param.numel(), static_cast<void*>(nullptr));
    }
    TORCH_CHECK(status.isOk(), status.message());
  }
  return true;
}

void Optimizer::step(const train::LearningRates& lr, const std::vector<at::Tensor>& grads, double gradDivisor) {
  at::NoGradGuard noGrad;
  beginStep();
  apply(slots_, lr, grads, gradDivisor);
}

void Optimizer::stepPiece(const train::LearningRates& lr, size_t slot, int64_t offset, const at::Tensor& grad) {
  at::NoGradGuard noGrad;
  const Slot& s = slots_[slot];
  const int64_t n = grad.numel();
  auto piece = [&](const at::Tensor& t) { return t.defined() ? t.view(-1).narrow(0, offset, n) : t; };
  std::vector<Slot> pieces{Slot{.name = s.name, .param = piece(s.param), .first = piece(s.first),
                                .second = piece(s.second), .step = s.step, .muon = s.muon}};
  apply(pieces, lr, {grad.view(-1)}, 1.0);
}

void Optimizer::apply(std::vector<Slot>& slots, const train::LearningRates& lr, const std::vector<at::Tensor>& grads,
                      double gradDivisor) {
  std::vector<Slot> elementwise;
  std::vector<at::Tensor> elementwiseGrads;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].muon) {
      elementwise.push_back(slots[i]);
      elementwiseGrads.push_back(grads[i]);
      continue;
    }
    // The gradient holds Muon's orthogonalized update (muon.h), still times the loss scale over
    // the clipping coefficient, like every gradient here.
    at::Tensor& p = slots[i].param;
    const planner::MuonConfig& m = config_.muon;
    if (m.weightDecay != 0) p.mul_(1.0 - lr.muonLr * m.weightDecay);
    p.add_(grads[i], -lr.muonLr / gradDivisor);
  }
  if (!elementwise.empty()) applyElementwise(elementwise, lr.lr, elementwiseGrads, gradDivisor);
}

void Optimizer::applyElementwise(std::vector<Slot>& slots, double lr, const std::vector<at::Tensor>& grads,
                                 double gradDivisor) {
  if (fused(slots) && !pluginServes(slots)) {
    fusedAdamStep(slots, lr, grads, gradDivisor);
    return;
  }
  if (gradDivisor != 1.0) {
    for (const at::Tensor& g : grads) g.div_(gradDivisor);
  }
  if (pluginStep(slots, lr, grads)) return;
  const auto& c = elementwise_;
  const double t = static_cast<double>(steps_);
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    at::Tensor g = grads[i];
    at::Tensor& p = s.param;
    switch (c.type) {
      case OptimizerType::kAdam:
      case OptimizerType::kAdamW: {
        if (c.weightDecay != 0) {
          if (c.decoupledWeightDecay) {
            p.mul_(1.0 - lr * c.weightDecay);
          } else {
            g = g.add(p, c.weightDecay);
          }
        }
        s.first.mul_(c.beta1).add_(g, 1.0 - c.beta1);
        s.second.mul_(c.beta2).addcmul_(g, g, 1.0 - c.beta2);
        const double bc1 = c.biasCorrection ? 1.0 - std::pow(c.beta1, t) : 1.0;
        const double bc2 = c.biasCorrection ? 1.0 - std::pow(c.beta2, t) : 1.0;
        at::Tensor denom = (s.second.sqrt() / std::sqrt(bc2)).add_(c.eps);
        p.addcdiv_(s.first, denom, -lr / bc1);
        break;
      }
      case OptimizerType::kLion: {
        at::Tensor update = (s.first * c.beta1).add_(g, 1.0 - c.beta1).sign_();
        if (c.weightDecay != 0) p.mul_(1.0 - lr * c.weightDecay);
        p.add_(update, -lr);
        s.first.mul_(c.beta2).add_(g, 1.0 - c.beta2);
        break;
      }
      case OptimizerType::kAdagrad: {
        if (c.weightDecay != 0) g = g.add(p, c.weightDecay);
        s.first.addcmul_(g, g, 1.0);
        p.addcdiv_(g, s.first.sqrt().add_(c.eps), -lr);
        break;
      }
      case OptimizerType::kMuon: break;  // elementwise_ is never Muon (OptimizerConfig::auxiliary)
    }
  }
}

TensorMap Optimizer::state() const {
  TensorMap out;
  for (const auto& s : slots_) {
    const auto& names = stateNames(s);
    out[s.name + "." + names[0]] = s.first;
    if (names.size() > 1) out[s.name + "." + names[1]] = s.second;
  }
  out["step"] = at::tensor({steps_}, at::kLong);
  return out;
}

Status Optimizer::restore(const TensorMap& state, const std::string& source) {
  at::NoGradGuard noGrad;
  auto take = [&](const std::string& key, at::Tensor& into) -> Status {
    auto it = state.find(key);
    if (it == state.end())
      return invalidArgument("{}: optimizer state {} is missing (was the checkpoint written with another optimizer "
                             "than {}?)",
                             source, key, planner::optimizerTypeName(config_.type));
    if (it->second.sizes() != into.sizes())
      return invalidArgument("{}: optimizer state {} has shape {}, expected {}", source, key,
                             c10::str(it->second.sizes()), c10::str(into.sizes()));
    into.copy_(it->second);
    return Status::ok();
  };
  for (auto& s : slots_) {
    const auto& names = stateNames(s);
    RETURN_IF_ERROR(take(s.name + "." + names[0], s.first));
    if (names.size() > 1) RETURN_IF_ERROR(take(s.name + "." + names[1], s.second));
  }
  auto step = state.find("step");
  if (step == state.end()) return invalidArgument("{}: optimizer state step is missing", source);
  steps_ = step->second.item<int64_t>();
  return Status::ok();
}

}  // namespace loom::worker
