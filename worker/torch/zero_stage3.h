#pragma once

#include <memory>

#include "backends/communicator.h"
#include "planner/deepspeed_config.h"
#include "worker/torch/zero_optimizer.h"

namespace loom::worker {

class DecoderModel;

// ZeRO stage 3 (DeepSpeed's stage3 semantics): every parameter is cut into dp parts
// (planner::partitionPerParameter); a rank keeps only its part, in the model's dtype and as fp32
// masters with their optimizer state. Parameters of at most stage3_param_persistence_threshold
// elements stay whole on every rank. The model's blocks (embedding, each decoder layer, head) run
// inside an autograd function that all-gathers the block's parameters, runs it without keeping
// activations, and releases them; in backward it gathers them again, recomputes the block with
// gradients, reduce-scatters the parameters' gradients into each rank's part and releases them.
// So a rank holds 1/dp of the parameters plus the block in use, and 1/dp of the gradients.
std::unique_ptr<ZeroEngine> makeZeroStage3(const planner::DeepSpeedConfig& config, DecoderModel& model,
                                           backends::Communicator* comm);

}  // namespace loom::worker
