#pragma once

#include <memory>

#include "backends/communicator.h"
#include "planner/deepspeed_config.h"
#include "worker/torch/zero/zero_optimizer.h"

namespace loom::worker {

class DecoderModel;

// ZeRO stage 3 (DeepSpeed's stage3 semantics): every parameter is cut into dp parts
// (planner::partitionPerParameter); a rank keeps only its part, in the model's dtype and as fp32
// masters with their optimizer state. Parameters of at most stage3_param_persistence_threshold
// elements stay whole on every rank. Each of the model's blocks (embedding, each decoder layer,
// head) all-gathers its parameters before it runs and releases them after; in backward, autograd
// functions around the block gather them again before the block's backward and, once its
// gradients are computed, reduce-scatter them into each rank's part and release the parameters.
// So a rank holds 1/dp of the parameters plus the block in use, and 1/dp of the gradients;
// activations are kept as in stage 0 (the linear layers save the weight parameter, not its data).
std::unique_ptr<ZeroEngine> makeZeroStage3(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                           DecoderModel& model, const ZeroGroups& groups);

}  // namespace loom::worker
