#pragma once

#include <algorithm>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/torch/optim/optimizer.h"

namespace loom::worker {

// One piece of a rank's offloaded optimizer step: `deviceGrad.numel()` elements of the optimizer's
// slot `slot` from `offset`, the gradient they take and where their update goes.
struct HostStepPiece {
  size_t slot = 0;
  int64_t offset = 0;
  at::Tensor deviceGrad;  // fp32, flat, on the model's device; divided by loss scale over clipping
  at::Tensor deviceOut;   // the model's dtype, flat, same length: gets the updated master
};

// ZeRO-Offload's optimizer step on the host (offload_optimizer.device cpu), pipelined. On a GPU,
// the gradient's pieces cross to pinned host memory on one copy stream while the host steps the
// pieces that have arrived, and each updated piece crosses back on a second stream (PCIe carries
// both ways at once) while the host steps the next: the copies hide under the host's step, as
// DeepSpeed's offload overlaps them. The arithmetic is that of copying everything over, stepping,
// and copying back. Returns when every update is on the device. Beside a CPU model the copies are
// plain ones.
class HostStepPipeline {
 public:
  // Pieces of at most 32M elements (128 MiB of fp32, about 25 ms of a 16-core host's AdamW), or
  // of DeepSpeed's sub_group_size where that is smaller: the tile of its offloaded step.
  static constexpr int64_t kMaxPieceNumel = int64_t(32) << 20;
  // `pinned` (offload_optimizer.pin_memory): the host staging is page-locked beside a GPU, so that
  // the copies run as DMA beside the host's work.
  HostStepPipeline(int64_t subGroupSize, bool pinned)
      : pieceNumel_(std::min(subGroupSize, kMaxPieceNumel)), pinned_(pinned) {}

  // Adds the elements [0, n) of the optimizer's slot `slot`, cut into pieces.
  void add(size_t slot, const at::Tensor& deviceGrad, const at::Tensor& deviceOut);
  // One optimizer step over every piece added since the last run (which it then forgets).
  void run(Optimizer& optimizer, const train::LearningRates& lr);

 private:
  int64_t pieceNumel_;
  bool pinned_;
  std::vector<HostStepPiece> pieces_;
  at::Tensor hostGrad_, hostModel_;  // staging, pinned beside a GPU, kept from step to step
};

}  // namespace loom::worker
