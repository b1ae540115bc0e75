#include "worker/torch/zero_optimizer.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "worker/torch/decoder_model.h"
#include "worker/torch/zero_stage3.h"

namespace loom::worker {

using backends::ReduceOp;

namespace {

std::vector<at::Tensor> viewsOf(const at::Tensor& flat, const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::vector<at::Tensor> views;
  int64_t offset = 0;
  for (const auto& [name, p] : params) {
    views.push_back(flat.slice(0, offset, offset + p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return views;
}

int64_t bytesOf(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

}  // namespace

ZeroOptimizer::ZeroOptimizer(const planner::DeepSpeedConfig& config,
                             std::vector<std::pair<std::string, at::Tensor>> params, backends::Communicator* comm)
    : config_(config), stage_(config.zero.stage), comm_(comm), params_(std::move(params)) {
  at::NoGradGuard noGrad;
  dp_ = comm ? comm->size() : 1;
  rank_ = comm ? comm->rank() : 0;
  std::vector<int64_t> numels;
  for (const auto& [name, p] : params_) numels.push_back(p.numel());
  const bool mixed = config.precision != planner::Precision::kFp32;
  if (stage_ == 0) {
    int64_t total = 0;
    for (int64_t n : numels) total += n;
    gradFlat_ = at::zeros({total}, at::kFloat);
    gradViews_ = viewsOf(gradFlat_, params_);
    std::vector<std::pair<std::string, at::Tensor>> masters;
    if (mixed) {
      masterFlat_ = at::empty({total}, at::kFloat);
      masterViews_ = viewsOf(masterFlat_, params_);
      for (size_t i = 0; i < params_.size(); ++i) masterViews_[i].copy_(params_[i].second);
    }
    for (size_t i = 0; i < params_.size(); ++i)
      masters.emplace_back(params_[i].first, mixed ? masterViews_[i] : params_[i].second);
    optimizer_ = std::make_unique<Optimizer>(config.optimizer, std::move(masters));
    return;
  }
  layout_ = planner::partitionFlat(numels, dp_);
  // The fp32 masters of this rank's partition: a slice of the (padded) flat parameters.
  at::Tensor flat = at::zeros({layout_.flatNumel}, at::kFloat);
  int64_t offset = 0;
  for (const auto& [name, p] : params_) {
    flat.slice(0, offset, offset + p.numel()).copy_(p.reshape({-1}));
    offset += p.numel();
  }
  masterPartition_ = flat.slice(0, rank_ * layout_.partitionNumel, (rank_ + 1) * layout_.partitionNumel).clone();
  gradPartition_ = at::zeros({layout_.partitionNumel}, at::kFloat);
  if (stage_ == 1) {
    gradFlat_ = at::zeros({layout_.flatNumel}, at::kFloat);
    gradViews_ = viewsOf(gradFlat_, params_);
  }
  optimizer_ = std::make_unique<Optimizer>(config.optimizer,
                                           std::vector<std::pair<std::string, at::Tensor>>{{"partition", masterPartition_}});
}

void ZeroOptimizer::zeroGradients() {
  if (gradFlat_.defined()) gradFlat_.zero_();
  if (gradPartition_.defined()) gradPartition_.zero_();
}

at::Tensor ZeroOptimizer::flattenGradients() const {
  at::Tensor flat = at::zeros({layout_.flatNumel}, at::kFloat);
  int64_t offset = 0;
  for (const auto& [name, p] : params_) {
    if (p.grad().defined()) flat.slice(0, offset, offset + p.numel()).copy_(p.grad().reshape({-1}));
    offset += p.numel();
  }
  return flat;
}

Status ZeroOptimizer::reduceScatterInto(const at::Tensor& flat, at::Tensor& partition) {
  if (!comm_) {
    partition.add_(flat.slice(0, 0, layout_.partitionNumel));
    return Status::ok();
  }
  // In buckets of reduce_bucket_size elements in all: bucket k carries elements [k*b, (k+1)*b)
  // of every rank's partition, laid out rank after rank as a reduce-scatter wants them.
  const int64_t part = layout_.partitionNumel;
  const int64_t perRank = std::max<int64_t>(1, config_.zero.reduceBucketSize / dp_);
  at::Tensor view = flat.view({dp_, part});
  for (int64_t begin = 0; begin < part; begin += perRank) {
    const int64_t end = std::min(part, begin + perRank);
    at::Tensor input = (begin == 0 && end == part) ? flat : view.slice(1, begin, end).contiguous().view({-1});
    at::Tensor output = at::empty({end - begin}, at::kFloat);
    RETURN_IF_ERROR(comm_->reduceScatter(output, input, ReduceOp::kAvg)->wait().withContext("ZeRO gradient reduce-scatter"));
    partition.slice(0, begin, end).add_(output);
  }
  return Status::ok();
}

Status ZeroOptimizer::accumulate() {
  at::NoGradGuard noGrad;
  if (stage_ == 2) {
    at::Tensor flat = flattenGradients();
    for (auto& [name, p] : params_) p.mutable_grad().reset();
    return reduceScatterInto(flat, gradPartition_);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    if (p.grad().defined()) gradViews_[i].add_(p.grad());
    p.mutable_grad().reset();
  }
  return Status::ok();
}

StatusOr<double> ZeroOptimizer::reduce(double lossScale) {
  at::NoGradGuard noGrad;
  at::Tensor grads;
  if (stage_ == 0) {
    if (comm_) RETURN_IF_ERROR(comm_->allReduce(gradFlat_, ReduceOp::kAvg)->wait().withContext("gradient all-reduce"));
    grads = gradFlat_;
  } else {
    if (stage_ == 1) RETURN_IF_ERROR(reduceScatterInto(gradFlat_, gradPartition_));
    grads = gradPartition_;
  }
  if (lossScale != 1.0) grads.div_(lossScale);
  at::Tensor squares = grads.pow(2).sum().to(at::kDouble).reshape({1});
  if (stage_ > 0 && comm_)
    RETURN_IF_ERROR(comm_->allReduce(squares, ReduceOp::kSum)->wait().withContext("gradient norm all-reduce"));
  return std::sqrt(squares.item<double>());
}

Status ZeroOptimizer::step(double lr, double clipCoefficient) {
  at::NoGradGuard noGrad;
  if (stage_ == 0) {
    if (clipCoefficient < 1.0) gradFlat_.mul_(clipCoefficient);
    optimizer_->step(lr, gradViews_);
    if (masterFlat_.defined()) {
      for (size_t i = 0; i < params_.size(); ++i) params_[i].second.copy_(masterViews_[i]);
    }
    return Status::ok();
  }
  if (clipCoefficient < 1.0) gradPartition_.mul_(clipCoefficient);
  optimizer_->step(lr, {gradPartition_});
  // Every rank's updated partition, in the model's dtype, to every rank.
  const at::ScalarType dtype = params_.front().second.scalar_type();
  at::Tensor full = at::empty({layout_.flatNumel}, dtype);
  at::Tensor mine = masterPartition_.to(dtype);
  if (comm_) {
    RETURN_IF_ERROR(comm_->allGather(full, mine)->wait().withContext("ZeRO parameter all-gather"));
  } else {
    full.copy_(mine);
  }
  std::vector<at::Tensor> views = viewsOf(full, params_);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].second.copy_(views[i]);
  return Status::ok();
}

TensorMap ZeroOptimizer::state() const {
  TensorMap out = optimizer_->state();
  if (stage_ > 0) {
    out["master.partition"] = masterPartition_;
  } else if (masterFlat_.defined()) {
    for (size_t i = 0; i < params_.size(); ++i) out["master." + params_[i].first] = masterViews_[i];
  }
  return out;
}

Status ZeroOptimizer::restore(const TensorMap& state, const std::string& source) {
  at::NoGradGuard noGrad;
  auto take = [&](const std::string& key, at::Tensor& into) -> Status {
    auto it = state.find(key);
    if (it == state.end()) return invalidArgument("{}: {} is missing", source, key);
    if (it->second.sizes() != into.sizes())
      return invalidArgument("{}: {} has shape {}, this rank's ZeRO stage {} layout needs {}", source, key,
                             c10::str(it->second.sizes()), stage_, c10::str(into.sizes()));
    into.copy_(it->second);
    return Status::ok();
  };
  if (stage_ > 0) {
    RETURN_IF_ERROR(take("master.partition", masterPartition_));
  } else if (masterFlat_.defined()) {
    for (size_t i = 0; i < params_.size(); ++i) RETURN_IF_ERROR(take("master." + params_[i].first, masterViews_[i]));
  }
  return optimizer_->restore(state, source);
}

StatusOr<TensorMap> ZeroOptimizer::fullWeights() {
  TensorMap out;
  for (const auto& [name, p] : params_) out[name] = p.detach();
  return out;
}

ZeroMemory ZeroOptimizer::memory() const {
  ZeroMemory m;
  for (const auto& [name, p] : params_) m.parameterBytes += bytesOf(p);
  m.parameterBytes += bytesOf(masterFlat_) + bytesOf(masterPartition_);
  m.gradientBytes = bytesOf(gradFlat_) + bytesOf(gradPartition_);
  for (const auto& [name, t] : optimizer_->state()) {
    if (name != "step") m.optimizerStateBytes += bytesOf(t);
  }
  return m;
}

std::unique_ptr<ZeroEngine> makeZeroEngine(const planner::DeepSpeedConfig& config, DecoderModel& model,
                                           backends::Communicator* comm) {
  if (config.zero.stage == 3) return makeZeroStage3(config, model, comm);
  return std::make_unique<ZeroOptimizer>(config, model.parameters(), comm);
}

}  // namespace loom::worker
