#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "planner/deepspeed_config.h"

namespace loom::worker {

class DecoderModel;
class Optimizer;

// Muon's momentum on (a piece of) a matrix's gradient `g`, elementwise, as DeepSpeed's
// muon_update: returns the new momentum, lerp(momentum, g, 1 - beta), or the old one where g is
// not finite (the step will be skipped, and the momentum must not carry the overflow into the
// next), and turns `g` in place into the Nesterov blend lerp(g, new momentum, beta), the matrix
// Newton-Schulz orthogonalizes.
at::Tensor advanceMomentum(at::Tensor& g, const at::Tensor& momentum, double beta);

// A matrix Muon updates (ParameterSpec::muon), as this rank's ZeRO stage holds it.
struct MuonMatrix {
  int parameter = 0;      // in the model's parameters()
  int64_t headWidth = 0;  // ParameterSpec::muonHeadDim: per-head Newton-Schulz in blocks of rows; 0: whole
  // Elements of this rank's tensor-parallel shard that each rank of the data-parallel group
  // holds, in rank order: together they tile the shard, row-major. Empty: every rank holds all of
  // it (ZeRO 0, a parameter ZeRO-3 keeps whole).
  std::vector<int64_t> heldBy;
};

// This rank's piece of a Muon matrix: the elements it holds, in rank order's place.
struct MuonPiece {
  int matrix = 0;       // in the matrices list
  at::Tensor grad;      // fp32 and flat: in, the reduced gradient times the loss scale; out, the update times it
  size_t slot = 0;      // the optimizer slot whose momentum (its first grad.numel() elements) it keeps
  at::Tensor momentum;  // set from that slot by makeMuonUpdater (on the host under optimizer offload)
};

// The Newton-Schulz half of a Muon step, run once per optimizer step on the reduced gradient,
// before the global norm (which DeepSpeed takes over the Muon updates, so that clipping covers
// them). Nesterov momentum is elementwise and runs on the piece each rank holds, as ZeRO
// partitions it; Newton-Schulz needs the whole matrix, and one rank of the data-parallel group
// computes it (matrices dealt out largest first, round-robin, one per rank per round): the pieces
// of a matrix cut over the group travel to that rank and the update travels back; a matrix every
// rank holds whole (ZeRO 0, ZeRO-3's persistent ones) is orthogonalized there and broadcast. A matrix that
// tensor parallelism split is gathered over the tensor-parallel group for Newton-Schulz, unless
// the split is a column split of whole heads under per_head_muon, where each rank's heads are
// orthogonalized on their own and that is exact. Newton-Schulz never runs on a slice.
class MuonUpdater {
 public:
  // `stageMomentum` (fp16): the momentum update() computes waits in a buffer for commit(), so a
  // step the loss scaler skips leaves the momentum as it was.
  MuonUpdater(const planner::MuonConfig& config, const DecoderModel& model, std::vector<MuonMatrix> matrices,
              std::vector<MuonPiece> pieces, backends::Communicator* dp, bool stageMomentum);

  // Replaces each piece's gradient (times `lossScale`) by its Muon update (times `lossScale`, so
  // that the norm and the unscaling downstream treat both alike).
  Status update(double lossScale);
  // The step was applied: its momentum becomes the optimizer's.
  void commit();
  int64_t stagingBytes() const;

 private:
  // Without a data-parallel group: every matrix, here.
  Status updateHeld();
  // The matrices every rank of the group holds whole: each rank orthogonalizes those dealt to it
  // and broadcasts their updates.
  Status updateWholeDealt();
  // Those cut over the data-parallel group: round by round.
  Status updateDistributed();
  // The update of matrix `m` from its whole blended shard (this rank's tensor-parallel shard).
  StatusOr<at::Tensor> orthogonalized(int m, const at::Tensor& shard);
  // Whether matrix `m` needs its tensor-parallel shards gathered for Newton-Schulz (a split that
  // is not a column split of whole heads under per-head Muon): it then goes alone.
  bool orthogonalizedAlone(int m) const;

  // The most elements of one batch of same-shaped matrices (fp32: 1 GiB, with the iteration's
  // half-precision copies beside it).
  static constexpr int64_t kBatchElements = int64_t(1) << 28;

  planner::MuonConfig config_;
  const DecoderModel& model_;
  std::vector<MuonMatrix> matrices_;
  std::vector<MuonPiece> pieces_;
  std::vector<int> pieceOf_;            // matrix -> its piece here, -1 if none
  // Matrices dealt out largest first, one per rank per round: round -> the matrix each rank
  // orthogonalizes (-1: none).
  std::vector<std::vector<int>> deal(std::vector<int> matrices) const;
  std::vector<std::vector<int>> rounds_;       // those cut over the data-parallel group
  std::vector<std::vector<int>> wholeRounds_;  // those every rank holds whole
  backends::Communicator* dp_;
  std::vector<at::Tensor> staged_;      // with stageMomentum: each piece's new momentum
  std::vector<at::Tensor> blends_;      // during update(): each piece's Nesterov blend
};

// The updater of `matrices` for a ZeRO engine: each piece's momentum is its slot's in `optimizer`,
// staged under fp16. Null when there is no matrix (every optimizer but Muon).
std::unique_ptr<MuonUpdater> makeMuonUpdater(const planner::DeepSpeedConfig& config, const DecoderModel& model,
                                             std::vector<MuonMatrix> matrices, std::vector<MuonPiece> pieces,
                                             const Optimizer& optimizer, backends::Communicator* dp);

}  // namespace loom::worker
