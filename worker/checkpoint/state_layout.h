#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/plan.h"

namespace loom::checkpoint {

// Which tensors of a Loom training checkpoint hold the optimizer's state, and what each holds, for
// one layout (its Plan and ZeRO stage), without libtorch: what the convert job reshards by. The
// ZeRO engines (worker/torch/zero/) keep exactly these, and a change to what they keep changes
// this too (tests/oracles/reshard_test.py resumes every stage from what it maps):
//   stage 0   "<param>.<state>" in the parameter's (tensor-parallel) shape, "master.<param>" too under
//             bf16/fp16: in optimizer.safetensors, or in every rank's file under tensor parallelism
//   stage 1-2 "master.partition" and "partition.<state>": the rank's partition of every flat
//             buffer end to end; under Muon one "<param>.<state>" per parameter piece instead
//   stage 3   "master.<param>" and "<param>.<state>": the rank's part, flat (the last padded), or
//             the whole parameter when persistent
// and every state file a "step" (int64 [1]). <state> is the optimizer rule's name (exp_avg,
// exp_avg_sq, momentum_buffer, sum; planner/optimizer_rules.h).

// A piece of one parameter's fp32 state inside a state tensor.
struct StatePiece {
  int parameter = 0;    // index in Plan::parameters
  int64_t offset = 0;   // its first element in the parameter's tensor-parallel piece, flattened
  int64_t length = 0;
  int64_t at = 0;       // where it lies in the tensor, flattened
};

struct StateTensor {
  std::string name;            // as the file names it
  std::string state;           // "master", or the optimizer rule's state name
  std::vector<int64_t> shape;
  std::vector<StatePiece> pieces;  // in tensor order; elements none covers are padding (zeros)
  int64_t numel() const;
};

// One file's state tensors.
struct StateFile {
  std::string file;  // "optimizer.safetensors" or rank_<r>.safetensors
  int rank = 0;      // the world rank that writes it
  int tpRank = 0;    // its index in its tensor-parallel group: which piece of each parameter it holds
  std::vector<StateTensor> tensors;
};

struct StateLayout {
  std::vector<StateFile> files;
  // Stage 0 in fp32: the optimizer updates the weights themselves, so the masters are the
  // checkpoint's model weights and no file holds them.
  bool mastersAreWeights = false;
};

// The file of world rank `rank`: its RNG state, and its optimizer state when the layout keeps it
// per rank.
std::string rankFileName(int rank);

// Whether each rank's file holds its own optimizer state (a ZeRO partition, tensor-parallel
// pieces, its own experts'), or rank 0's optimizer.safetensors the one whole state.
bool statePerRank(int zeroStage, int tensorParallel, int expertParallel);

// The layout of `plan` under `config` (its ZeRO stage, precision and optimizer). Under expert
// parallelism each rank's file holds its own experts' state beside the dense parameters'; at
// stages 1-2 the experts' buffers follow the dense ones in the partition, cut over the
// expert-data-parallel group, and at stage 3 each expert's part is its place in that group.
StatusOr<StateLayout> stateLayout(const planner::Plan& plan, const planner::DeepSpeedConfig& config);

}  // namespace loom::checkpoint
