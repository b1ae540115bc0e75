#include "worker/torch/zero/host_step.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#ifdef LOOM_HAVE_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace loom::worker {

void HostStepPipeline::add(size_t slot, const at::Tensor& deviceGrad, const at::Tensor& deviceOut) {
  const at::Tensor grad = deviceGrad.view(-1), out = deviceOut.view(-1);
  const int64_t n = grad.numel();
  for (int64_t offset = 0; offset < n; offset += pieceNumel_) {
    const int64_t len = std::min(pieceNumel_, n - offset);
    pieces_.push_back({.slot = slot, .offset = offset, .deviceGrad = grad.narrow(0, offset, len),
                       .deviceOut = out.narrow(0, offset, len)});
  }
}

void HostStepPipeline::run(Optimizer& optimizer, const train::LearningRates& lr) {
  at::NoGradGuard noGrad;
  const std::vector<HostStepPiece> pieces = std::move(pieces_);
  pieces_.clear();
  optimizer.beginStep();
  if (pieces.empty()) return;
  const at::Device device = pieces.front().deviceGrad.device();
  const at::ScalarType dtype = pieces.front().deviceOut.scalar_type();
  int64_t total = 0;
  for (const auto& p : pieces) total += p.deviceGrad.numel();
  if (!hostGrad_.defined() || hostGrad_.numel() < total || hostModel_.scalar_type() != dtype) {
    const auto host = at::TensorOptions().pinned_memory(pinned_ && device.is_cuda());
    hostGrad_ = at::empty({total}, host.dtype(at::kFloat));
    hostModel_ = at::empty({total}, host.dtype(dtype));
  }
  std::vector<at::Tensor> grads, models;  // each piece's staging
  int64_t at = 0;
  for (const auto& p : pieces) {
    grads.push_back(hostGrad_.narrow(0, at, p.deviceGrad.numel()));
    models.push_back(hostModel_.narrow(0, at, p.deviceGrad.numel()));
    at += p.deviceGrad.numel();
  }
  // The host's part of a piece: its step, then its update in the model's dtype.
  auto stepOnHost = [&](size_t i) {
    const HostStepPiece& p = pieces[i];
    optimizer.stepPiece(lr, p.slot, p.offset, grads[i]);
    models[i].copy_(optimizer.master(p.slot).narrow(0, p.offset, grads[i].numel()));
  };
#ifdef LOOM_HAVE_NCCL
  if (device.is_cuda()) {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
    const c10::cuda::CUDAStream down = c10::cuda::getStreamFromPool(false, device.index());
    const c10::cuda::CUDAStream up = c10::cuda::getStreamFromPool(false, device.index());
    // The gradients are final once the compute stream gets here.
    at::cuda::CUDAEvent gradientsReady;
    gradientsReady.record(compute);
    gradientsReady.block(down);
    std::vector<at::cuda::CUDAEvent> arrived(pieces.size());
    {
      c10::cuda::CUDAStreamGuard onDown(down);
      for (size_t i = 0; i < pieces.size(); ++i) {
        grads[i].copy_(pieces[i].deviceGrad, /*non_blocking=*/true);
        arrived[i].record(down);
      }
    }
    try {
      for (size_t i = 0; i < pieces.size(); ++i) {
        arrived[i].synchronize();
        stepOnHost(i);
        c10::cuda::CUDAStreamGuard onUp(up);
        pieces[i].deviceOut.copy_(models[i], /*non_blocking=*/true);
      }
    } catch (...) {
      // The copies in flight use the pieces' tensors and the staging: let them end first.
      down.synchronize();
      up.synchronize();
      throw;
    }
    // The staging is written again next step, and the compute stream reads the updates next.
    up.synchronize();
    return;
  }
#endif
  for (size_t i = 0; i < pieces.size(); ++i) {
    grads[i].copy_(pieces[i].deviceGrad);
    stepOnHost(i);
    pieces[i].deviceOut.copy_(models[i]);
  }
}

}  // namespace loom::worker
