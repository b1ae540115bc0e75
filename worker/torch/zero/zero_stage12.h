#pragma once

#include <memory>

#include "worker/torch/zero/zero_optimizer.h"

namespace loom::worker {

// Stages 1 and 2 (DeepSpeed's stage_1_and_2): the parameters of each block of the model
// (embedding, each decoder layer, head; a tied weight belongs to the first block that uses it)
// are laid end to end in a flat buffer padded to a multiple of 2 x dp and cut into dp equal
// parts, as the Plan's ZeroPlan::buffers lay them out (planner::partitionFlat); rank r owns part r
// of every block, and keeps the fp32 masters
// and optimizer state of those parts only. After the optimizer step the updated parts are
// all-gathered into every rank's model.
// - stage 1: the whole gradient is accumulated and reduce-scattered at the end of the step.
// - stage 2: each block's gradient is reduce-scattered into the owners' parts as soon as that
//   block's backward is done (overlapping the backward of the blocks below it when
//   overlap_comm), in reduce_bucket_size pieces; only the rank's part is kept across
//   micro-batches.
std::unique_ptr<ZeroEngine> makeZeroStage12(const planner::DeepSpeedConfig& config, const planner::Plan& plan,
                                            DecoderModel& model, const ZeroGroups& groups);

}  // namespace loom::worker
