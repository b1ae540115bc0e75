#include "planner/parallel_checks.h"

namespace loom::planner {

Status checkSequenceParallel(const ModelConfig& c, int sp, int64_t sequenceLength) {
  if (sp < 1) return invalidArgument("sequence_parallel_size: must be at least 1, got {}", sp);
  if (sp == 1) return Status::ok();
  if (sequenceLength % sp != 0)
    return invalidArgument("sequence_parallel_size {}: the sequence length {} is not a multiple of it", sp,
                           sequenceLength);
  if (c.numHeads % sp != 0)
    return invalidArgument("sequence_parallel_size {}: num_attention_heads {} is not a multiple of it", sp, c.numHeads);
  if (c.numKvHeads % sp != 0 && sp % c.numKvHeads != 0)
    return invalidArgument("sequence_parallel_size {}: num_key_value_heads {} neither splits into it nor divides it",
                           sp, c.numKvHeads);
  return Status::ok();
}

Status checkExpertParallel(const ModelConfig& c, int ep) {
  if (ep < 1) return invalidArgument("expert_parallel.autoep_size: must be at least 1, got {}", ep);
  if (ep == 1) return Status::ok();
  if (!c.isMoe()) return invalidArgument("expert_parallel.autoep_size {}: {} has no experts", ep, modelFamilyName(c.family));
  if (c.numExperts % ep != 0)
    return invalidArgument("expert_parallel.autoep_size {}: the {} experts do not split evenly over it", ep,
                           c.numExperts);
  return Status::ok();
}

int expertOwner(int expert, int64_t numExperts, int ep) {
  return static_cast<int>(expert / (numExperts / ep));
}

}  // namespace loom::planner
