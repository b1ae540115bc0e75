#include "worker/torch/optim/muon.h"

#include <algorithm>
#include <map>
#include <numeric>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "worker/torch/model/decoder_model.h"
#include "worker/torch/optim/newton_schulz.h"
#include "worker/torch/optim/optimizer.h"
#include "worker/torch/parallel/whole_weights.h"

namespace loom::worker {

at::Tensor advanceMomentum(at::Tensor& g, const at::Tensor& momentum, double beta) {
  at::Tensor next = at::where(at::isfinite(g).all(), momentum.lerp(g, 1.0 - beta), momentum);
  g.lerp_(next, beta);
  return next;
}

std::unique_ptr<MuonUpdater> makeMuonUpdater(const planner::DeepSpeedConfig& config, const DecoderModel& model,
                                             std::vector<MuonMatrix> matrices, std::vector<MuonPiece> pieces,
                                             const Optimizer& optimizer, backends::Communicator* dp) {
  if (matrices.empty()) return nullptr;
  for (MuonPiece& p : pieces) p.momentum = optimizer.momentum(p.slot).narrow(0, 0, p.grad.numel());
  return std::make_unique<MuonUpdater>(config.optimizer.muon, model, std::move(matrices), std::move(pieces), dp,
                                       config.precision == planner::Precision::kFp16);
}

MuonUpdater::MuonUpdater(const planner::MuonConfig& config, const DecoderModel& model, std::vector<MuonMatrix> matrices,
                         std::vector<MuonPiece> pieces, backends::Communicator* dp, bool stageMomentum)
    : config_(config), model_(model), matrices_(std::move(matrices)), pieces_(std::move(pieces)),
      pieceOf_(matrices_.size(), -1), dp_(dp && dp->size() > 1 ? dp : nullptr) {
  for (size_t i = 0; i < pieces_.size(); ++i) pieceOf_[pieces_[i].matrix] = static_cast<int>(i);
  if (stageMomentum) {
    for (const MuonPiece& p : pieces_) staged_.push_back(at::empty_like(p.momentum));
  }
  // Over a data-parallel group each matrix is orthogonalized by one rank: largest first, dealt
  // round-robin (round k gives rank r the (k * dp + r)-th), those cut over the group apart from
  // those every rank holds whole. Every rank computes the same deal from the same list.
  if (!dp_) return;
  std::vector<int> cut, whole;
  for (size_t m = 0; m < matrices_.size(); ++m) (matrices_[m].heldBy.empty() ? whole : cut).push_back(static_cast<int>(m));
  rounds_ = deal(cut);
  wholeRounds_ = deal(whole);
}

std::vector<std::vector<int>> MuonUpdater::deal(std::vector<int> matrices) const {
  auto numel = [&](int m) {
    const auto& held = matrices_[m].heldBy;
    return held.empty() ? pieces_[pieceOf_[m]].grad.numel() : std::accumulate(held.begin(), held.end(), int64_t{0});
  };
  std::stable_sort(matrices.begin(), matrices.end(), [&](int a, int b) { return numel(a) > numel(b); });
  const size_t ranks = static_cast<size_t>(dp_->size());
  std::vector<std::vector<int>> rounds;
  for (size_t k = 0; k < matrices.size(); k += ranks) {
    std::vector<int> round(ranks, -1);
    for (size_t r = 0; r < ranks && k + r < matrices.size(); ++r) round[r] = matrices[k + r];
    rounds.push_back(std::move(round));
  }
  return rounds;
}

int64_t MuonUpdater::stagingBytes() const {
  int64_t bytes = 0;
  for (const at::Tensor& t : staged_) bytes += t.numel() * t.element_size();
  return bytes;
}

Status MuonUpdater::update(double lossScale) {
  at::NoGradGuard noGrad;
  const double beta = config_.momentum;
  blends_.assign(pieces_.size(), at::Tensor());
  // Unscaled first, so the momentum holds true gradients whatever the loss scale does.
  std::vector<at::Tensor> grads, momenta;
  bool away = false;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    MuonPiece& p = pieces_[i];
    blends_[i] = lossScale == 1.0 ? p.grad : p.grad / lossScale;
    grads.push_back(blends_[i]);
    momenta.push_back(p.momentum);
    away |= p.momentum.device() != p.grad.device();
  }
  // The common case, every gradient finite (one look, which the step's norm makes anyway): the
  // momentum and the blend as two multi-tensor passes over all pieces. Else, or with the momentum
  // on the host, piece by piece with advanceMomentum's guard.
  bool finite = !away && !grads.empty();
  if (finite) {
    std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
    finite = at::isfinite(at::stack(norms)).all().item<bool>();
  }
  if (finite) {
    if (staged_.empty()) {
      at::_foreach_lerp_(momenta, grads, 1.0 - beta);
      at::_foreach_lerp_(grads, momenta, beta);
    } else {
      at::_foreach_copy_(staged_, momenta);
      at::_foreach_lerp_(staged_, grads, 1.0 - beta);
      at::_foreach_lerp_(grads, staged_, beta);
    }
  } else {
    for (size_t i = 0; i < pieces_.size(); ++i) {
      MuonPiece& p = pieces_[i];
      at::Tensor& g = blends_[i];
      at::Tensor momentum = p.momentum.device() != g.device() ? p.momentum.to(g.device()) : p.momentum;
      at::Tensor next = advanceMomentum(g, momentum, beta);
      (staged_.empty() ? p.momentum : staged_[i]).copy_(next);
    }
  }
  RETURN_IF_ERROR(dp_ ? updateWholeDealt() : updateHeld());
  RETURN_IF_ERROR(updateDistributed());
  if (lossScale != 1.0) {
    for (MuonPiece& p : pieces_) p.grad.mul_(lossScale);
  }
  blends_.clear();
  return Status::ok();
}

void MuonUpdater::commit() {
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < staged_.size(); ++i) pieces_[i].momentum.copy_(staged_[i]);
}

StatusOr<at::Tensor> MuonUpdater::orthogonalized(int m, const at::Tensor& shard) {
  const MuonMatrix& matrix = matrices_[m];
  const ShardLayout& layout = model_.shards().layouts[matrix.parameter];
  const at::Tensor blend = shard.view(layout.local);
  if (!orthogonalizedAlone(m)) return orthogonalize(blend, config_.nsMethod, matrix.headWidth).reshape({-1});
  ASSIGN_OR_RETURN(at::Tensor whole, wholeParameter(model_, matrix.parameter, blend));
  return takeShard(orthogonalize(whole, config_.nsMethod, matrix.headWidth), layout).reshape({-1});
}

bool MuonUpdater::orthogonalizedAlone(int m) const {
  const MuonMatrix& matrix = matrices_[m];
  const ShardLayout& layout = model_.shards().layouts[matrix.parameter];
  const bool headsWhole = matrix.headWidth > 0 && layout.dim == 0 && layout.subParams.empty();
  return layout.sharded() && model_.tensorParallel().size() > 1 && !headsWhole;
}

Status MuonUpdater::updateHeld() {
  // Where the kernels are fused (a GPU), matrices of one shape go through Newton-Schulz together,
  // kBatchElements at most at once: a few large batched GEMMs in place of five iterations' worth
  // of small launches per matrix. Elsewhere one at a time, as DeepSpeed does.
  const bool batched = newtonSchulzKernels(model_.device()) == NsKernels::kFused;
  std::map<std::pair<std::vector<int64_t>, int64_t>, std::vector<int>> sameShape;
  for (size_t m = 0; m < matrices_.size(); ++m) {
    const int i = pieceOf_[m];
    if (!batched || orthogonalizedAlone(static_cast<int>(m))) {
      ASSIGN_OR_RETURN(at::Tensor u, orthogonalized(static_cast<int>(m), blends_[i]));
      pieces_[i].grad.copy_(u);
      continue;
    }
    const auto& local = model_.shards().layouts[matrices_[m].parameter].local;
    sameShape[{local, matrices_[m].headWidth}].push_back(static_cast<int>(m));
  }
  for (const auto& [key, members] : sameShape) {
    const auto& [shape, headWidth] = key;
    const int64_t numel = shape[0] * shape[1];
    const size_t perBatch = static_cast<size_t>(std::max<int64_t>(1, kBatchElements / numel));
    for (size_t begin = 0; begin < members.size(); begin += perBatch) {
      const size_t end = std::min(members.size(), begin + perBatch);
      std::vector<at::Tensor> blends;
      for (size_t k = begin; k < end; ++k) blends.push_back(blends_[pieceOf_[members[k]]].view(shape));
      at::Tensor updates = orthogonalize(at::stack(blends), config_.nsMethod, headWidth);
      for (size_t k = begin; k < end; ++k) pieces_[pieceOf_[members[k]]].grad.copy_(updates[k - begin].reshape({-1}));
    }
  }
  return Status::ok();
}

Status MuonUpdater::updateWholeDealt() {
  const int ranks = dp_->size(), me = dp_->rank();
  for (const std::vector<int>& round : wholeRounds_) {
    if (round[me] >= 0) {
      const int i = pieceOf_[round[me]];
      ASSIGN_OR_RETURN(at::Tensor u, orthogonalized(round[me], blends_[i]));
      pieces_[i].grad.copy_(u);
    }
    // Each owner's update to every rank, in place in their gradients.
    std::vector<std::shared_ptr<backends::Work>> works;
    for (int r = 0; r < ranks; ++r) {
      if (round[r] >= 0) works.push_back(dp_->broadcast(pieces_[pieceOf_[round[r]]].grad, r));
    }
    for (auto& w : works) RETURN_IF_ERROR(w->wait().withContext("Muon: sharing Newton-Schulz updates"));
  }
  return Status::ok();
}

Status MuonUpdater::updateDistributed() {
  const int ranks = dp_ ? dp_->size() : 1, me = dp_ ? dp_->rank() : 0;
  const auto options = at::TensorOptions().dtype(at::kFloat).device(model_.device());
  for (const std::vector<int>& round : rounds_) {
    // Out: this rank's piece of the matrix each rank owns this round. In: the pieces of the one it owns.
    std::vector<int64_t> sendSplits(ranks, 0), recvSplits(ranks, 0);
    std::vector<at::Tensor> sends;
    for (int r = 0; r < ranks; ++r) {
      const int m = round[r];
      if (m < 0 || pieceOf_[m] < 0) continue;
      sendSplits[r] = blends_[pieceOf_[m]].numel();
      sends.push_back(blends_[pieceOf_[m]]);
    }
    const int owned = round[me];
    if (owned >= 0) recvSplits = matrices_[owned].heldBy;
    const int64_t recvTotal = std::accumulate(recvSplits.begin(), recvSplits.end(), int64_t{0});
    at::Tensor sendBuffer = sends.empty() ? at::empty({0}, options) : at::cat(sends);
    at::Tensor whole = at::empty({recvTotal}, options);
    RETURN_IF_ERROR(dp_->allToAllV(whole, sendBuffer, recvSplits, sendSplits)
                        ->wait()
                        .withContext("Muon: gathering matrices for Newton-Schulz"));
    at::Tensor update = at::empty({recvTotal}, options);
    if (owned >= 0) {
      ASSIGN_OR_RETURN(update, orthogonalized(owned, whole));
    }
    // Back: each rank's piece of the update of the matrix this rank owns.
    at::Tensor pieces = at::empty({sendBuffer.numel()}, options);
    RETURN_IF_ERROR(dp_->allToAllV(pieces, update, sendSplits, recvSplits)
                        ->wait()
                        .withContext("Muon: returning Newton-Schulz updates"));
    int64_t offset = 0;
    for (int r = 0; r < ranks; ++r) {
      const int m = round[r];
      if (m < 0 || pieceOf_[m] < 0) continue;
      pieces_[pieceOf_[m]].grad.copy_(pieces.slice(0, offset, offset + sendSplits[r]));
      offset += sendSplits[r];
    }
  }
  return Status::ok();
}

}  // namespace loom::worker
