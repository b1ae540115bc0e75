#pragma once

#include <memory>
#include <string>
#include <utility>

#include <ATen/core/ScalarType.h>
#include <c10/core/Device.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "planner/job_spec.h"
#include "planner/plan.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/parallel/rank_mesh.h"

namespace loom::worker {

// The model dtype a DeepSpeed precision trains in (master weights stay fp32 regardless).
at::ScalarType modelDtype(planner::Precision precision);

struct BuiltModel {
  std::unique_ptr<DecoderModel> model;
  std::string configText;  // the HF config.json, saved with checkpoints
};

// Reads model.config, builds this rank's part of the decoder in the job's precision as `plan`
// lays it out over the mesh's tensor-parallel group (each parameter's split and local shape) and
// shares each sample's tokens over its sequence-parallel group, checks
// every parameter against the Plan (name, whole and local shape, dtype), and loads model.weights
// or draws the seeded init, keeping this rank's pieces. Errors name the spec field and the file.
StatusOr<BuiltModel> buildModel(const planner::JobSpec& spec, const planner::Plan& plan, at::Device device,
                                const RankMesh& mesh);

// The device a rank computes on: the CPU, or for resources.device cuda the GPU of its local rank.
at::Device rankDevice(const planner::JobSpec& spec, int localRank);
// Makes a GPU the thread's current device (as torchrun scripts do with torch.cuda.set_device):
// kernels launched without a device of their own, a plugin's among them, go to the rank's GPU.
void makeCurrent(const at::Device& device);
// Gives the memory libtorch's caching allocator holds but no tensor uses back to the driver, so
// that the driver's free memory (deviceMemoryInfo) counts it: after tensors were replaced.
void releaseCachedMemory(const at::Device& device);
// Waits for the work queued on `device`'s current stream (nothing on the CPU): a clock read after
// it measures the GPU, not how far ahead the host got.
void synchronize(const at::Device& device);
// The CUDA device's name ("NVIDIA H200"); empty on the CPU.
std::string deviceName(const at::Device& device);

// The most memory libtorch's allocator has held on `device` since the rank started (its
// max_memory_allocated); 0 on the CPU.
int64_t devicePeakBytes(const at::Device& device);

// The device's free and total memory in bytes (cudaMemGetInfo); {0, 0} on the CPU.
std::pair<int64_t, int64_t> deviceMemoryInfo(const at::Device& device);

// Threads for libtorch: the machine's cores shared among the ranks on this node.
void setThreadsForRanks(int localWorldSize);

}  // namespace loom::worker
