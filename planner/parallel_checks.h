#pragma once

#include <cstdint>

#include "common/status.h"
#include "planner/model_config.h"

namespace loom::planner {

// Ulysses sequence parallelism (DeepSpeed's sequence/layer.py): the all-to-all scatters heads and
// gathers the sequence, so the sequence must split into sp parts, the query heads into sp groups,
// and the KV heads either split too or be copied to every rank (sp a multiple of them).
// InvalidArgument names the number that does not divide.
Status checkSequenceParallel(const ModelConfig& config, int sp, int64_t sequenceLength);

// Expert parallelism: the experts split evenly over ep ranks.
Status checkExpertParallel(const ModelConfig& config, int ep);
// The expert-parallel rank that owns `expert`: consecutive experts share a rank, as DeepSpeed
// lays them out (rank r holds experts r*E/ep to (r+1)*E/ep - 1).
int expertOwner(int expert, int64_t numExperts, int ep);

}  // namespace loom::planner
