#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::rollout {

// The model's end-of-sequence token ids, as transformers' generate finds them: eos_token_id (a
// number or a list) of generation_config.json beside `configPath`, else of config.json itself.
// Empty when neither names one: generation then ends by length or stop tokens only.
StatusOr<std::vector<int64_t>> readEosTokenIds(const std::string& configPath);

}  // namespace loom::rollout
