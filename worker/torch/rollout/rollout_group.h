#pragma once

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/rollout/step_batch.h"

namespace loom::worker {

// A rollout over a tensor-parallel group: rank 0 schedules and samples, and every rank computes
// each step's forward over its shard of the model and its KV heads. Rank 0 sends each step (its
// HostStep), each weight reload and the end to the others before it acts on them; they follow
// until the end. Messages go over the group's communicator as a fixed header and a payload of
// int64, on the rank's device.
class RolloutGroup {
 public:
  RolloutGroup(backends::Communicator& tp, at::Device device) : tp_(tp), device_(device) {}
  bool leader() const { return tp_.rank() == 0; }
  int size() const { return tp_.size(); }

  // ---- rank 0 ----
  void sendStep(const HostStep& step);
  void sendReload(const std::string& dir);
  void sendEnd();

  // ---- the others: until rank 0 sends the end ----
  using Reload = std::function<Status(const std::string& dir)>;
  Status follow(DecoderModel& model, PagedKvCache& cache, int64_t slidingWindow, const Reload& reload);

  // Every rank: the whole vocabulary's logits [R, V] from this rank's vocabulary shard [R, V/tp]
  // (as they are when the head is not split).
  at::Tensor gatherLogits(const at::Tensor& local, int64_t vocab);
  // The smallest of every rank's `value` (the KV blocks each rank's memory allows).
  int64_t minimum(int64_t value);

 private:
  enum class Kind : int64_t { kStep, kReload, kEnd };
  void send(Kind kind, const HostStep* step, const at::Tensor& payload);

  backends::Communicator& tp_;
  at::Device device_;
};

}  // namespace loom::worker
