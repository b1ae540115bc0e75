#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace loom::worker {

class DecoderModel;

// Activation checkpointing (DeepSpeed's `activation_checkpointing`, HF's gradient
// checkpointing): a checkpointed decoder layer keeps only its input through forward, runs under
// no grad, and is computed again in backward, where autograd then goes through the recomputed
// graph. Its MoE routing is recorded in forward and replayed in the recomputation (moe.h:
// RoutingRecord). The models have no dropout (and router jitter is refused), so the
// recomputation draws no random numbers and gives the forward's values.
struct ActivationCheckpointing {
  bool enabled = false;
  // The first `layers` decoder layers are checkpointed (number_checkpoints); -1: all of them.
  int64_t layers = -1;
  // cpu_checkpointing: the kept inputs wait in host memory (pinned, for a GPU's copies to overlap).
  bool toHost = false;

  // Whether decoder layer `layer` (0-based) is checkpointed.
  bool covers(int64_t layer) const { return enabled && (layers < 0 || layer < layers); }
};

// What a checkpointed layer returns: its output and, for a MoE layer, its router logits (with
// the graph through the checkpoint, for the load-balancing loss); undefined otherwise.
struct CheckpointedOutput {
  at::Tensor hidden;
  at::Tensor routerLogits;
};

// model.decoderLayer(index, input), checkpointed. Every rank recomputes its layers in the same
// order (backward's), so the collectives inside a layer (tensor, sequence and expert
// parallelism) run again in step.
CheckpointedOutput checkpointedLayer(DecoderModel& model, int index, const at::Tensor& input,
                                     const ActivationCheckpointing& options);

}  // namespace loom::worker
