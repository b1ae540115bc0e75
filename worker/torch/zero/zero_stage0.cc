#include "worker/torch/zero/zero_stage0.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "worker/torch/model/decoder_model.h"
#include "worker/torch/optim/muon.h"
#include "worker/torch/optim/optimizer.h"
#include "worker/torch/zero/zero_buffers.h"

namespace loom::worker {
namespace {

using backends::ReduceOp;

class ZeroStage0 final : public ZeroEngine {
 public:
  ZeroStage0(const planner::DeepSpeedConfig& config, const planner::Plan& plan, DecoderModel& model,
             const ZeroGroups& groups)
      : comm_(groups.dense), groups_(groups), model_(model), params_(trainableOnly(model.parameters())),
        normWeights_(trainableNormWeights(model)), wireType_(gradientWireType(config, model)) {
    at::NoGradGuard noGrad;
    backends::Communicator* comm = comm_;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(model.device());
    // Two gradient buffers: the dense parameters', averaged over the data-parallel group, and the
    // experts', summed over the expert-data-parallel group (ZeroGroups).
    std::vector<bool> expert;
    for (size_t i = 0; i < model.parameters().size(); ++i)
      if (model.parameters()[i].second.requires_grad()) expert.push_back(plan.parameters[i].expert >= 0);
    int64_t denseTotal = 0, expertTotal = 0, total = 0;
    for (size_t k = 0; k < params_.size(); ++k) (expert[k] ? expertTotal : denseTotal) += params_[k].second.numel();
    total = denseTotal + expertTotal;
    gradFlat_ = collectiveBuffer(comm, denseTotal, f32).zero_();
    expertGradFlat_ = collectiveBuffer(groups.expertData, expertTotal, f32).zero_();
    int64_t denseOffset = 0, expertOffset = 0;
    for (size_t k = 0; k < params_.size(); ++k) {
      const at::Tensor& p = params_[k].second;
      int64_t& offset = expert[k] ? expertOffset : denseOffset;
      gradViews_.push_back((expert[k] ? expertGradFlat_ : gradFlat_).slice(0, offset, offset + p.numel()).view(p.sizes()));
      (expert[k] ? expertViews_ : denseViews_).push_back(gradViews_.back());
      (expert[k] ? expertNormWeights_ : denseNormWeights_).push_back(normWeights_[k]);
      offset += p.numel();
    }
    std::vector<std::pair<std::string, at::Tensor>> masters;
    if (config.precision != planner::Precision::kFp32) {
      masterFlat_ = at::empty({total}, f32);
      masterViews_ = viewsInto(masterFlat_, params_);
      for (size_t i = 0; i < params_.size(); ++i) masterViews_[i].copy_(params_[i].second);
    }
    for (size_t i = 0; i < params_.size(); ++i)
      masters.emplace_back(params_[i].first, masterFlat_.defined() ? masterViews_[i] : params_[i].second);
    // Every rank holds every matrix whole (MuonUpdater deals them out for Newton-Schulz).
    std::vector<bool> muon;
    std::vector<MuonMatrix> matrices;
    std::vector<MuonPiece> pieces;
    for (size_t i = 0, k = 0; i < model.parameters().size(); ++i) {
      if (!model.parameters()[i].second.requires_grad()) continue;
      const planner::ParameterSpec& spec = plan.parameters[i];
      muon.push_back(spec.muon);
      if (spec.muon) {
        pieces.push_back({.matrix = static_cast<int>(matrices.size()), .grad = gradViews_[k].view({-1}), .slot = k,
                          .momentum = {}});
        matrices.push_back({.parameter = static_cast<int>(i), .headWidth = spec.muonHeadDim, .heldBy = {}});
      }
      ++k;
    }
    optimizer_ = std::make_unique<Optimizer>(config.optimizer, std::move(masters), muon);
    muon_ = makeMuonUpdater(config, model, std::move(matrices), std::move(pieces), *optimizer_, comm_);
  }

  // The first micro-batch copies its gradients into the buffer rather than adding them to zeros:
  // one pass over the buffer fewer, and none to clear it.
  void zeroGradients() override { bufferHoldsStep_ = false; }

  Status accumulate() override {
    at::NoGradGuard noGrad;
    std::vector<at::Tensor> into, grads;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i].second;
      if (p.grad().defined()) {
        into.push_back(gradViews_[i]);
        grads.push_back(p.grad());
      } else if (!bufferHoldsStep_) {
        gradViews_[i].zero_();
      }
    }
    if (!into.empty()) bufferHoldsStep_ ? at::_foreach_add_(into, grads) : at::_foreach_copy_(into, grads);
    bufferHoldsStep_ = true;
    for (auto& [name, p] : params_) p.mutable_grad().reset();
    return Status::ok();
  }

  StatusOr<double> reduce(double lossScale) override {
    at::NoGradGuard noGrad;
    if (comm_) RETURN_IF_ERROR(allReduceGradients(gradFlat_, *comm_, ReduceOp::kAvg, "gradient all-reduce"));
    if (expertGradFlat_.numel() > 0 && groups_.expertData) {
      RETURN_IF_ERROR(allReduceGradients(expertGradFlat_, *groups_.expertData, ReduceOp::kSum,
                                         "expert gradient all-reduce"));
      if (comm_ && comm_->size() > 1) expertGradFlat_.div_(comm_->size());
    }
    if (muon_) RETURN_IF_ERROR(muon_->update(lossScale));
    lossScale_ = lossScale;
    backends::Communicator& tp = model_.tensorParallel();
    // Each rank holds its pieces of the tensor-parallel parameters: their squares add up over the
    // group. Its experts are the expert-parallel group's share of all of them.
    auto squaresOf = [&](const at::Tensor& flat, const std::vector<at::Tensor>& views, const std::vector<double>& w) {
      return tp.size() == 1 ? flatSquares(flat) : weightedSquares(views, w, flat.options());
    };
    at::Tensor squares = squaresOf(gradFlat_, denseViews_, denseNormWeights_);
    if (!expertViews_.empty()) {
      at::Tensor experts = squaresOf(expertGradFlat_, expertViews_, expertNormWeights_);
      if (groups_.expert) RETURN_IF_ERROR(sumOver(*groups_.expert, experts, "expert gradient norm all-reduce"));
      squares = squares + experts;
    }
    RETURN_IF_ERROR(sumOver(tp, squares, "gradient norm all-reduce over the tensor-parallel group"));
    return std::sqrt(squares.item<double>()) / lossScale;
  }

  Status step(const train::LearningRates& lr, double clipCoefficient) override {
    at::NoGradGuard noGrad;
    if (muon_) muon_->commit();
    optimizer_->step(lr, gradViews_, lossScale_ / clipCoefficient);
    if (masterFlat_.defined()) {
      std::vector<at::Tensor> params;
      for (auto& [name, p] : params_) params.push_back(p);
      at::_foreach_copy_(params, masterViews_);
    }
    return Status::ok();
  }

  // "<param>.exp_avg", ... and, under bf16 / fp16, "master.<param>".
  TensorMap state() const override {
    TensorMap out = optimizer_->state();
    if (masterFlat_.defined()) {
      for (size_t i = 0; i < params_.size(); ++i) out["master." + params_[i].first] = masterViews_[i];
    }
    return out;
  }

  Status restore(const TensorMap& state, const std::string& source, bool optimizerState) override {
    if (masterFlat_.defined()) {
      for (size_t i = 0; i < params_.size(); ++i)
        RETURN_IF_ERROR(restoreTensor(state, "master." + params_[i].first, masterViews_[i], source));
    }
    return optimizerState ? optimizer_->restore(state, source) : Status::ok();
  }

  ZeroMemory memory() const override {
    ZeroMemory m;
    for (const auto& [name, p] : model_.parameters()) m.parameterBytes += bytesOf(p);
    m.parameterBytes += bytesOf(masterFlat_);
    m.gradientBytes = bytesOf(gradFlat_) + bytesOf(expertGradFlat_);
    m.optimizerStateBytes = stateBytes(*optimizer_) + (muon_ ? muon_->stagingBytes() : 0);
    return m;
  }

  StatusOr<at::Tensor> weightPiece(int parameter) override { return model_.parameters()[parameter].second.detach(); }

 private:
  Status allReduceGradients(at::Tensor& flat, backends::Communicator& comm, ReduceOp op, const char* what) {
    if (wireType_ == at::kFloat) return comm.allReduce(flat, op)->wait().withContext(what);
    at::Tensor wire = collectiveBuffer(&comm, flat.numel(), flat.options().dtype(wireType_));
    wire.copy_(flat);
    RETURN_IF_ERROR(comm.allReduce(wire, op)->wait().withContext(what));
    flat.copy_(wire);
    return Status::ok();
  }

  backends::Communicator* comm_;
  ZeroGroups groups_;
  const DecoderModel& model_;
  std::vector<std::pair<std::string, at::Tensor>> params_;  // the trainable ones
  std::vector<double> normWeights_;                         // theirs (tensorParallelNormWeight)
  at::ScalarType wireType_;                                 // gradientWireType
  at::Tensor gradFlat_, expertGradFlat_, masterFlat_;  // the dense and the expert gradients (see the constructor)
  std::vector<at::Tensor> denseViews_, expertViews_;    // gradViews_ split by kind, for the norm
  std::vector<double> denseNormWeights_, expertNormWeights_;
  bool bufferHoldsStep_ = false;  // gradFlat_ holds this step's first micro-batch already
  double lossScale_ = 1.0;        // the step's, from reduce()
  std::vector<at::Tensor> gradViews_, masterViews_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<MuonUpdater> muon_;  // Muon: its matrices' Newton-Schulz
};

}  // namespace

std::unique_ptr<ZeroEngine> makeZeroStage0(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                           DecoderModel& model, const ZeroGroups& groups) {
  return std::make_unique<ZeroStage0>(config, plan, model, groups);
}

}  // namespace loom::worker
