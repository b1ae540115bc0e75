#include "worker/torch/zero/zero_stage3.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "planner/zero_partition.h"
#include "worker/torch/zero/block_hooks.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/zero/host_parts.h"
#include "worker/torch/zero/host_step.h"
#include "worker/torch/optim/muon.h"
#include "worker/torch/optim/optimizer.h"
#include "worker/torch/zero/zero_buffers.h"

namespace loom::worker {
namespace {

using backends::ReduceOp;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;


class ZeroStage3 final : public ZeroEngine, public BlockRunner, public BlockBackwardHooks {
 public:
  ZeroStage3(const planner::DeepSpeedConfig& config, const planner::Plan& plan, DecoderModel& model,
             const ZeroGroups& groups);

  void zeroGradients() override;
  // Reduced during backward, block by block; the embedding's (whose input is the tokens, which
  // carry no gradient) after it.
  Status accumulate() override;
  StatusOr<double> reduce(double lossScale) override;
  Status step(const train::LearningRates& lr, double clipCoefficient) override;
  TensorMap state() const override;
  Status restore(const TensorMap& state, const std::string& source, bool optimizerState) override;
  ZeroMemory memory() const override;
  StatusOr<at::Tensor> weightPiece(int parameter) override;
  at::Tensor run(DecoderModel& model, int index, const at::Tensor& input) override;
  void beforeBlockBackward(int block) override;
  void afterBlockBackward(int block) override;

 private:
  // An all-gather of a block's parts in flight, started ahead of its use (prefetch).
  struct Gather {
    std::shared_ptr<backends::Work> work;
    at::Tensor all;
    std::function<void()> partsArrived;  // offload_param: the compute stream waits for the parts' copies
  };
  // A gradient reduce-scatter in flight and where its result goes.
  struct Pending {
    std::shared_ptr<backends::Work> work;
    at::Tensor input, output;
    std::vector<int> params;
    double scale = 1.0;
  };
  // The ranks a parameter is cut over: the data-parallel group for dense parameters, the
  // expert-data-parallel group for experts (ZeroGroups); both are group 0 without expert
  // parallelism.
  struct Group {
    backends::Communicator* comm = nullptr;
    int rank = 0, size = 1;
    ReduceOp op = ReduceOp::kAvg;
    double scale = 1.0;  // applied to the reduced gradient: 1 / dp after an expert sum
  };
  void startGather(int block);
  void gather(int block);
  void release(int block);
  void reduceGradients(int block, bool wait);
  Status finishPending();

  struct Param {
    std::string name;
    at::Tensor tensor;  // the model's parameter: whole while gathered, empty otherwise
    std::vector<int64_t> shape;
    int64_t numel = 0;
    bool persistent = false;
    int64_t part = 0;    // elements of this rank's part (the whole parameter when persistent)
    at::Tensor local;    // this rank's part in the model's dtype (non-persistent); on the host with offload_param
    bool trainable = true;  // false: frozen (train.frozen_parameters), no master and no gradient
    int group = 0;          // in groups_
    at::Tensor master;   // fp32 [part]
    at::Tensor grad;     // fp32 [part]
  };
  // The block's parameters cut into parts over `group`, all of them (to gather) or the trainable
  // ones (whose gradients are reduced).
  std::vector<int> partitioned(int block, int group, bool trainableOnly = false) const;
  // This rank's part of the whole parameter `whole` (any shape, p.numel elements), padded.
  at::Tensor localPart(const Param& p, const at::Tensor& whole) const;

  const planner::DeepSpeedConfig& config_;
  DecoderModel& model_;
  backends::Communicator* comm_;
  int dp_ = 1;
  int rank_ = 0;
  std::vector<Group> groups_;
  backends::Communicator* expert_ = nullptr;  // the expert-parallel group, for the norm
  at::ScalarType dtype_;
  at::TensorOptions f32_, modelOptions_;  // fp32, and the model's dtype, on the model's device
  at::ScalarType wireType_;               // gradientWireType
  std::vector<Param> params_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<MuonUpdater> muon_;  // Muon: its matrices' Newton-Schulz
  double lossScale_ = 1.0;  // the step's, from reduce()
  std::unique_ptr<HostStepPipeline> hostStep_;  // offload_optimizer.device cpu
  std::unique_ptr<HostParts> hostParts_;        // offload_param.device cpu beside a GPU
  std::map<std::pair<int, int>, Gather> gathers_;  // by block and group
  std::vector<Pending> pending_;
};

// A linear layer whose backward keeps the weight parameter itself rather than a view of its
// data (at::linear saves weight.t(), which would pin the gathered storage until backward): the
// weight's storage can then be released after forward and gathered again before backward.
struct ParameterLinear : public torch::autograd::Function<ParameterLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return at::linear(x, weight);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& g = grads[0];
    // A frozen weight (train.frozen_parameters) or the first layer's input need no gradient.
    at::Tensor gx = ctx->needs_input_grad(0) ? g.matmul(weight) : at::Tensor();
    at::Tensor gw = ctx->needs_input_grad(1) ? g.reshape({-1, g.size(-1)}).t().mm(x.reshape({-1, x.size(-1)}))
                                             : at::Tensor();
    return {gx, gw};
  }
};

at::Tensor parameterLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  at::Tensor out = ParameterLinear::apply(x, weight);
  return bias.defined() ? out + bias : out;
}

ZeroStage3::ZeroStage3(const planner::DeepSpeedConfig& config, const planner::Plan& plan, DecoderModel& model,
                       const ZeroGroups& groups)
    : config_(config), model_(model), comm_(groups.dense), dtype_(model.dtype()),
      f32_(at::TensorOptions().dtype(at::kFloat).device(model.device())), modelOptions_(f32_.dtype(model.dtype())),
      wireType_(gradientWireType(config, model)) {
  at::NoGradGuard noGrad;
  backends::Communicator* comm = comm_;
  dp_ = comm ? comm->size() : 1;
  rank_ = comm ? comm->rank() : 0;
  groups_.push_back(Group{.comm = comm_, .rank = rank_, .size = dp_});
  if (groups.expertData && groups.expertData->size() != dp_) {
    groups_.push_back(Group{.comm = groups.expertData, .rank = groups.expertData->rank(),
                            .size = groups.expertData->size(), .op = ReduceOp::kSum, .scale = 1.0 / dp_});
    expert_ = groups.expert;
  }
  const size_t count = model.parameters().size();
  // offload_param.device cpu: the parts in host memory. On CPU ranks they are there already.
  if (config.zero.offloadParam == "cpu" && model.device().is_cuda())
    hostParts_ = std::make_unique<HostParts>(model.device(), dtype_, config.zero.offloadParamPinMemory);
  // offload_optimizer.device cpu: masters and optimizer state on the host (pinned beside a GPU).
  const at::TensorOptions masterOptions =
      config.zero.offloadOptimizer == "cpu"
          ? at::TensorOptions().dtype(at::kFloat).pinned_memory(model.device().is_cuda() && config.zero.offloadPinMemory)
          : f32_;
  std::vector<std::pair<std::string, at::Tensor>> masters;
  for (size_t i = 0; i < count; ++i) {
    const auto& [name, t] = model.parameters()[i];
    // The Plan's part of each parameter (planner::partitionPerParameter); a buffer, which ZeRO
    // does not partition, stays whole.
    const planner::ParameterSpec& spec = plan.parameters[i];
    const bool persistent = spec.persistent || spec.partitionNumel == 0;
    Param p{.name = name, .tensor = t, .shape = t.sizes().vec(), .numel = t.numel(), .persistent = persistent,
            .part = persistent ? t.numel() : spec.partitionNumel, .trainable = t.requires_grad(),
            .group = spec.expert >= 0 && groups_.size() > 1 ? 1 : 0};
    if (p.persistent) {
      if (p.trainable) p.master = at::empty({p.numel}, masterOptions).copy_(t.detach().reshape({-1}));
    } else {
      p.local = localPart(p, t);
      if (p.trainable) p.master = at::empty({p.part}, masterOptions).copy_(p.local);
      if (hostParts_) p.local = hostParts_->allocate(p.part).copy_(p.local);
      t.set_data(at::empty({0}, modelOptions_));  // released until a block needs it
    }
    if (p.trainable) {
      p.grad = at::zeros({p.master.numel()}, f32_);
      masters.emplace_back(name, p.master);
    }
    params_.push_back(std::move(p));
  }
  // Muon: a partitioned matrix's parts are its rows' elements in rank order (the padding of the
  // last part is nobody's); a persistent one is whole on every rank.
  std::vector<bool> muon;
  std::vector<MuonMatrix> matrices;
  std::vector<MuonPiece> pieces;
  for (size_t i = 0, slot = 0; i < count; ++i) {
    const Param& p = params_[i];
    if (!p.trainable) continue;
    const planner::ParameterSpec& spec = plan.parameters[i];
    muon.push_back(spec.muon);
    if (spec.muon) {
      MuonMatrix m{.parameter = static_cast<int>(i), .headWidth = spec.muonHeadDim, .heldBy = {}};
      int64_t mine = p.numel;
      if (!p.persistent) {
        for (int r = 0; r < dp_; ++r) m.heldBy.push_back(std::clamp<int64_t>(p.numel - r * p.part, 0, p.part));
        mine = m.heldBy[rank_];
      }
      if (mine > 0)
        pieces.push_back({.matrix = static_cast<int>(matrices.size()), .grad = p.grad.narrow(0, 0, mine), .slot = slot,
                          .momentum = {}});
      matrices.push_back(std::move(m));
    }
    ++slot;
  }
  optimizer_ = std::make_unique<Optimizer>(config.optimizer, std::move(masters), muon);
  muon_ = makeMuonUpdater(config, model, std::move(matrices), std::move(pieces), *optimizer_, comm);
  if (config.zero.offloadOptimizer == "cpu") hostStep_ = std::make_unique<HostStepPipeline>(config.zero.subGroupSize, config.zero.offloadPinMemory);
  model.setBlockRunner(this);
  model.setLinear(parameterLinear);
}

at::Tensor ZeroStage3::localPart(const Param& p, const at::Tensor& whole) const {
  const Group& g = groups_[p.group];
  at::Tensor padded = at::zeros({p.part * g.size}, modelOptions_);
  padded.slice(0, 0, p.numel).copy_(whole.reshape({-1}));
  return padded.slice(0, g.rank * p.part, (g.rank + 1) * p.part).clone();
}

std::vector<int> ZeroStage3::partitioned(int block, int group, bool trainableOnly) const {
  std::vector<int> out;
  for (int i : model_.blockParameters(block)) {
    const Param& p = params_[i];
    if (!p.persistent && p.group == group && (p.trainable || !trainableOnly)) out.push_back(i);
  }
  return out;
}

at::Tensor ZeroStage3::run(DecoderModel& model, int index, const at::Tensor& input) {
  const bool training = at::GradMode::is_enabled();
  at::Tensor x = training && input.requires_grad() ? hookAfterBackward(input, this, index) : input;
  gather(index);
  // The next block's parameters travel while this one computes.
  if (config_.zero.prefetchBucketSize > 0 && index + 1 < model.numBlocks()) startGather(index + 1);
  at::Tensor out = model.block(index, x);
  release(index);
  return training && out.requires_grad() ? hookBeforeBackward(out, this, index) : out;
}

void ZeroStage3::beforeBlockBackward(int block) {
  gather(block);
  if (config_.zero.prefetchBucketSize > 0 && block > 0) startGather(block - 1);
}

void ZeroStage3::afterBlockBackward(int block) {
  reduceGradients(block, /*wait=*/!config_.zero.overlapComm);
  release(block);
}

Status ZeroStage3::accumulate() {
  try {
    for (int block = 0; block < model_.numBlocks(); ++block) {
      bool left = false;
      for (int i : model_.blockParameters(block)) left |= params_[i].tensor.grad().defined();
      if (!left) continue;
      reduceGradients(block, /*wait=*/false);
      release(block);
    }
  } catch (const std::exception& e) {
    return internalError("{}", e.what());
  }
  return finishPending();
}

Status ZeroStage3::finishPending() {
  at::NoGradGuard noGrad;
  Status status;
  for (auto& p : pending_) {
    Status s = p.work->wait().withContext("ZeRO-3 gradient reduce-scatter");
    if (!s.isOk()) {
      if (status.isOk()) status = s;
      continue;
    }
    int64_t offset = 0;
    for (int i : p.params) {
      params_[i].grad.add_(p.output.slice(0, offset, offset + params_[i].part), p.scale);
      offset += params_[i].part;
    }
  }
  pending_.clear();
  return status;
}

void ZeroStage3::startGather(int block) {
  // The block's parts end to end: one all-gather for the whole block, per group (its dense
  // parameters over the data-parallel group, its experts over the expert-data-parallel group),
  // every rank in the same group order.
  for (int group = 0; group < static_cast<int>(groups_.size()); ++group) {
    const std::vector<int> ids = partitioned(block, group);
    if (ids.empty() || gathers_.count({block, group})) continue;
    std::vector<at::Tensor> locals;
    int64_t width = 0;
    for (int i : ids) {
      locals.push_back(params_[i].local);
      width += params_[i].part;
    }
    const Group& on = groups_[group];
    Gather g{nullptr, at::empty({on.size * width}, modelOptions_), {}};
    auto gatherFrom = [&](const at::Tensor& mine) {
      if (on.comm) {
        g.work = on.comm->allGather(g.all, mine);
      } else {
        g.all.copy_(mine);
      }
    };
    if (hostParts_) {
      g.partsArrived = hostParts_->upload(locals, gatherFrom);
    } else {
      gatherFrom(at::cat(locals));
    }
    gathers_[{block, group}] = std::move(g);
  }
}

void ZeroStage3::gather(int block) {
  at::NoGradGuard noGrad;
  startGather(block);
  for (int group = 0; group < static_cast<int>(groups_.size()); ++group) {
    const std::vector<int> ids = partitioned(block, group);
    if (ids.empty()) continue;
    Gather g = std::move(gathers_[{block, group}]);
    gathers_.erase({block, group});
    if (g.work) throwIfError(g.work->wait().withContext("ZeRO-3 parameter all-gather"));
    if (g.partsArrived) g.partsArrived();
    int64_t width = 0;
    for (int i : ids) width += params_[i].part;
    at::Tensor byRank = g.all.view({groups_[group].size, width});
    int64_t offset = 0;
    for (int i : ids) {
      Param& p = params_[i];
      at::Tensor whole = byRank.slice(1, offset, offset + p.part).reshape({-1}).slice(0, 0, p.numel);
      p.tensor.set_data(whole.reshape(p.shape).clone());
      offset += p.part;
    }
  }
}

void ZeroStage3::release(int block) {
  for (int group = 0; group < static_cast<int>(groups_.size()); ++group)
    for (int i : partitioned(block, group)) params_[i].tensor.set_data(at::empty({0}, modelOptions_));
}

void ZeroStage3::reduceGradients(int block, bool wait) {
  at::NoGradGuard noGrad;
  for (int group = 0; group < static_cast<int>(groups_.size()); ++group) {
    const Group& on = groups_[group];
    const std::vector<int> ids = partitioned(block, group, /*trainableOnly=*/true);
    if (ids.empty()) continue;
    int64_t width = 0;
    for (int i : ids) width += params_[i].part;
    // Rank r's slice of every parameter's gradient, laid out rank after rank for the
    // reduce-scatter; a parameter that got no gradient this time contributes zeros.
    at::Tensor input = at::zeros({on.size, width}, f32_);
    int64_t offset = 0;
    for (int i : ids) {
      Param& p = params_[i];
      if (p.tensor.grad().defined()) {
        at::Tensor padded = at::zeros({p.part * on.size}, f32_);
        padded.slice(0, 0, p.numel).copy_(p.tensor.grad().reshape({-1}));
        input.slice(1, offset, offset + p.part).copy_(padded.view({on.size, p.part}));
      }
      offset += p.part;
    }
    const at::TensorOptions wire = f32_.dtype(wireType_);
    Pending p{nullptr, input.view({-1}).to(wireType_), at::empty({width}, wire), ids, on.scale};
    if (on.comm) {
      p.work = on.comm->reduceScatter(p.output, p.input, on.op);
    } else {
      p.output.copy_(p.input);
      p.work = std::make_shared<backends::Work>("local reduce");
      p.work->complete(Status::ok());
    }
    pending_.push_back(std::move(p));
  }
  for (int i : model_.blockParameters(block)) {
    Param& p = params_[i];
    if (!p.tensor.grad().defined()) continue;
    if (p.persistent) {
      const Group& on = groups_[p.group];
      at::Tensor g = p.tensor.grad().to(wireType_).reshape({-1}).contiguous();
      if (on.comm) throwIfError(on.comm->allReduce(g, on.op)->wait().withContext("ZeRO-3 gradient all-reduce"));
      p.grad.add_(g, on.scale);
    }
    p.tensor.mutable_grad().reset();
  }
  if (wait) throwIfError(finishPending());
}

void ZeroStage3::zeroGradients() {
  for (auto& p : params_)
    if (p.trainable) p.grad.zero_();
}

StatusOr<double> ZeroStage3::reduce(double lossScale) {
  at::NoGradGuard noGrad;
  if (muon_) RETURN_IF_ERROR(muon_->update(lossScale));
  lossScale_ = lossScale;
  // Persistent parameters are whole and the same on every rank of the data-parallel group: counted
  // once, not summed over it. Over the tensor-parallel group, each distinct piece counts once.
  const int tp = model_.tensorParallel().size();
  // Parts of the experts are summed over the data-parallel group too: its expert-data-parallel
  // groups, one per expert-parallel index, cut each expert once. A persistent expert is whole on
  // the ranks of its index, so counted once over the expert-parallel group.
  std::vector<at::Tensor> parts, whole, wholeExperts;
  std::vector<double> partWeights, wholeWeights, wholeExpertWeights;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    if (!p.trainable) continue;
    const double weight = tensorParallelNormWeight(model_.shards().layouts[i], tp);
    if (!p.persistent) {
      parts.push_back(p.grad);
      partWeights.push_back(weight);
    } else {
      (p.group == 0 ? whole : wholeExperts).push_back(p.grad);
      (p.group == 0 ? wholeWeights : wholeExpertWeights).push_back(weight);
    }
  }
  at::Tensor squares = weightedSquares(parts, partWeights, f32_);
  if (comm_) RETURN_IF_ERROR(comm_->allReduce(squares, ReduceOp::kSum)->wait().withContext("gradient norm all-reduce"));
  at::Tensor total = squares + weightedSquares(whole, wholeWeights, f32_);
  if (expert_) {
    at::Tensor experts = weightedSquares(wholeExperts, wholeExpertWeights, f32_);
    RETURN_IF_ERROR(sumOver(*expert_, experts, "expert gradient norm all-reduce"));
    total = total + experts;
  }
  RETURN_IF_ERROR(sumOver(model_.tensorParallel(), total, "gradient norm all-reduce over the tensor-parallel group"));
  return std::sqrt(total.item<double>()) / lossScale;
}

Status ZeroStage3::step(const train::LearningRates& lr, double clipCoefficient) {
  at::NoGradGuard noGrad;
  if (muon_) muon_->commit();
  const double divisor = lossScale_ / clipCoefficient;
  // Where each trainable part's update goes: the whole parameter when persistent, else this
  // rank's part (gathered from the parts when a block runs).
  auto destination = [](Param& p) { return p.persistent ? p.tensor.view({-1}) : p.local; };
  if (hostStep_) {
    // Offloaded: the step runs on the host, the gradients scaled on the device first.
    size_t slot = 0;
    for (auto& p : params_) {
      if (!p.trainable) continue;
      if (divisor != 1.0) p.grad.div_(divisor);
      hostStep_->add(slot++, p.grad, destination(p));
    }
    hostStep_->run(*optimizer_, lr);
    return Status::ok();
  }
  std::vector<at::Tensor> grads;
  for (auto& p : params_)
    if (p.trainable) grads.push_back(p.grad);
  optimizer_->step(lr, grads, divisor);
  for (auto& p : params_) {
    if (!p.trainable) continue;
    if (hostParts_ && !p.persistent) {
      hostParts_->download(p.local, p.master);
    } else {
      destination(p).copy_(p.master);
    }
  }
  if (hostParts_) hostParts_->finishDownloads();
  return Status::ok();
}

TensorMap ZeroStage3::state() const {
  TensorMap out = optimizer_->state();
  for (const auto& p : params_)
    if (p.trainable) out["master." + p.name] = p.master;
  return out;
}

Status ZeroStage3::restore(const TensorMap& state, const std::string& source, bool optimizerState) {
  at::NoGradGuard noGrad;
  for (auto& p : params_) {
    if (!p.trainable) {
      // A frozen parameter has no master: its value is the checkpoint's weight ("frozen.<name>").
      auto weight = state.find("frozen." + p.name);
      if (weight == state.end()) return invalidArgument("{}: frozen parameter {} is missing", source, p.name);
      if (weight->second.numel() != p.numel)
        return invalidArgument("{}: frozen parameter {} has {} elements, the model {}", source, p.name,
                               weight->second.numel(), p.numel);
      if (p.persistent) {
        p.tensor.view({-1}).copy_(weight->second.reshape({-1}));
      } else {
        p.local.copy_(localPart(p, weight->second));
      }
      continue;
    }
    auto it = state.find("master." + p.name);
    if (it == state.end()) return invalidArgument("{}: master.{} is missing", source, p.name);
    if (it->second.numel() != p.master.numel())
      return invalidArgument("{}: master.{} has {} elements, this rank's ZeRO-3 part has {}", source, p.name,
                             it->second.numel(), p.master.numel());
    p.master.copy_(it->second.reshape({-1}));
    if (p.persistent) {
      p.tensor.copy_(p.master.view(p.shape));
    } else {
      p.local.copy_(p.master);
    }
  }
  return optimizerState ? optimizer_->restore(state, source) : Status::ok();
}

ZeroMemory ZeroStage3::memory() const {
  ZeroMemory m;
  for (const auto& p : params_) {
    const int64_t held = p.persistent ? p.numel * c10::elementSize(dtype_) : p.local.numel() * p.local.element_size();
    m.parameterBytes += held + (p.trainable ? p.master.numel() * 4 : 0);
    m.gradientBytes += p.trainable ? p.grad.numel() * 4 : 0;
  }
  for (const auto& [name, t] : optimizer_->state()) {
    if (name != "step") m.optimizerStateBytes += t.numel() * t.element_size();
  }
  if (muon_) m.optimizerStateBytes += muon_->stagingBytes();
  return m;
}

StatusOr<at::Tensor> ZeroStage3::weightPiece(int parameter) {
  at::NoGradGuard noGrad;
  Param& p = params_[parameter];
  if (p.persistent) return p.tensor.detach().clone();
  const Group& on = groups_[p.group];
  at::Tensor all = at::empty({on.size * p.part}, modelOptions_);
  if (on.comm) {
    const at::Tensor mine = p.local.to(modelOptions_.device());  // on the host with offload_param
    RETURN_IF_ERROR(on.comm->allGather(all, mine)->wait().withContext("ZeRO-3 gathering " + p.name));
  } else {
    all.copy_(p.local);
  }
  return all.slice(0, 0, p.numel).view(p.shape);
}

}  // namespace

std::unique_ptr<ZeroEngine> makeZeroStage3(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                           DecoderModel& model, const ZeroGroups& groups) {
  return std::make_unique<ZeroStage3>(config, plan, model, groups);
}

}  // namespace loom::worker
