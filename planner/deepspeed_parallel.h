#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/json_reader.h"

// The parallel sections of a DeepSpeed config (tensor_parallel, expert_parallel,
// sequence_parallel_size): parsed and written back by deepspeed_config.cc through these.
namespace loom::planner {

// Reads the three keys from the `deepspeed` object into `config` (its sizes, not yet checked
// against the world size).
Status parseParallelSections(ObjectReader& deepspeed, DeepSpeedConfig* config);
// Adds them, defaults filled in, to the normalized `deepspeed` object.
void parallelSectionsToJson(const DeepSpeedConfig& config, nlohmann::json& out);

}  // namespace loom::planner
