#include "worker/torch/zero/host_parts.h"

#include <memory>

#include <ATen/ATen.h>
#ifdef LOOM_HAVE_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace loom::worker {

HostParts::HostParts(at::Device device, at::ScalarType dtype, bool pinned)
    : device_(device), hostOptions_(at::TensorOptions().dtype(dtype).pinned_memory(pinned && device.is_cuda())) {}

at::Tensor HostParts::allocate(int64_t numel) const { return at::empty({numel}, hostOptions_); }

std::function<void()> HostParts::upload(const std::vector<at::Tensor>& parts,
                                        const std::function<void(const at::Tensor& onDevice)>& use) {
  int64_t total = 0;
  for (const at::Tensor& p : parts) total += p.numel();
  auto copyInto = [&](const at::Tensor& onDevice) {
    int64_t offset = 0;
    for (const at::Tensor& p : parts) {
      onDevice.narrow(0, offset, p.numel()).copy_(p, /*non_blocking=*/true);
      offset += p.numel();
    }
  };
#ifdef LOOM_HAVE_NCCL
  if (device_.is_cuda()) {
    const c10::cuda::CUDAStream copies = c10::cuda::getStreamFromPool(false, device_.index());
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    {
      c10::cuda::CUDAStreamGuard onCopies(copies);
      // Allocated on the copy stream: its memory is reused only after the copy stream is past it.
      const at::Tensor onDevice = at::empty({total}, hostOptions_.device(device_).pinned_memory(false));
      copyInto(onDevice);
      use(onDevice);
      done->record(copies);
    }
    return [done, device = device_] { done->block(c10::cuda::getCurrentCUDAStream(device.index())); };
  }
#endif
  const at::Tensor onDevice = at::empty({total}, hostOptions_.device(device_).pinned_memory(false));
  copyInto(onDevice);
  use(onDevice);
  return [] {};
}

void HostParts::download(const at::Tensor& to, const at::Tensor& from) { to.copy_(from, /*non_blocking=*/true); }

void HostParts::finishDownloads() {
#ifdef LOOM_HAVE_NCCL
  if (device_.is_cuda()) c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
}

}  // namespace loom::worker
