#pragma once

#include <memory>
#include <string>

#include <ATen/core/ScalarType.h>
#include <c10/core/Device.h>

#include "common/status.h"
#include "planner/job_spec.h"
#include "planner/plan.h"
#include "worker/torch/decoder_model.h"

namespace loom::worker {

// The model dtype a DeepSpeed precision trains in (master weights stay fp32 regardless).
at::ScalarType modelDtype(planner::Precision precision);

struct BuiltModel {
  std::unique_ptr<DecoderModel> model;
  std::string configText;  // the HF config.json, saved with checkpoints
  planner::Plan plan;      // what the planner compiled for this job, which the model was checked against
};

// Reads model.config, compiles the job's Plan (the same pure compiler the planner service ran on
// submit), builds the decoder in the job's precision, checks every parameter against the Plan
// (name, shape, dtype), and loads model.weights or draws the seeded init. Errors name the spec
// field and the file.
StatusOr<BuiltModel> buildModel(const planner::JobSpec& spec, at::Device device);

// The device a rank computes on: the CPU, or for resources.device cuda the GPU of its local rank.
at::Device rankDevice(const planner::JobSpec& spec, int localRank);
// Makes a GPU the thread's current device (as torchrun scripts do with torch.cuda.set_device):
// kernels launched without a device of their own, a plugin's among them, go to the rank's GPU.
void makeCurrent(const at::Device& device);
// Waits for the work queued on `device`'s current stream (nothing on the CPU): a clock read after
// it measures the GPU, not how far ahead the host got.
void synchronize(const at::Device& device);

// Threads for libtorch: the machine's cores shared among the ranks on this node.
void setThreadsForRanks(int localWorldSize);

}  // namespace loom::worker
