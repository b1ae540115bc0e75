#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace loom::worker {

// offload_param's half of ZeRO stage 3: each rank's parts of the partitioned parameters live in
// host memory (page-locked with pin_memory, so that copies run as DMA beside the compute), and
// cross to the device only when their block is gathered. Beside a GPU, a block's parts cross on a
// copy stream of their own and its all-gather waits for that stream alone, so that the next
// block's parts travel while the current block computes; the compute stream waits for them only
// where the block is used.
class HostParts {
 public:
  HostParts(at::Device device, at::ScalarType dtype, bool pinned);

  // Host memory for a part of `numel` elements of the model's dtype.
  at::Tensor allocate(int64_t numel) const;

  // Copies `parts` (host) end to end into one device tensor and calls `use` with it while the copy
  // stream is current, so that a collective `use` starts waits for the copies and nothing else.
  // Returns what makes the compute stream wait for the copies (and for what `use` did on the copy
  // stream): call it before the compute stream reads what `use` produced.
  std::function<void()> upload(const std::vector<at::Tensor>& parts,
                               const std::function<void(const at::Tensor& onDevice)>& use);

  // The optimizer's update of a part: `from` (on the device) into the host part `to`, without the
  // host waiting; finishDownloads() waits for all of them.
  void download(const at::Tensor& to, const at::Tensor& from);
  void finishDownloads();

 private:
  at::Device device_;
  at::TensorOptions hostOptions_;
};

}  // namespace loom::worker
