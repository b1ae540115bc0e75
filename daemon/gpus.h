#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace loom::daemon {

// A node's GPUs as placement resources: CUDA indices in PCI bus order, each taken by one rank of
// a cuda job. An index listed twice is two slots on one GPU.

// The GPUs the NVIDIA driver lists (/proc/driver/nvidia/gpus, one entry per GPU): CUDA indices
// 0..N-1 in PCI bus order. Empty without the driver.
std::vector<int> detectGpus();
// loomd --gpus: "0,1,2,3" (an index twice: two slots on one GPU), or "none".
StatusOr<std::vector<int>> parseGpuList(const std::string& text);
// The `offered` GPUs that `held` (the live ranks' GPUs) leaves free, lowest index first: a
// launch's local rank i takes the i-th.
std::vector<int> freeGpus(const std::vector<int>& offered, const std::vector<int>& held);
// A CUDA_VISIBLE_DEVICES value: "0,2".
std::string visibleDevices(const std::vector<int>& gpus);

}  // namespace loom::daemon
