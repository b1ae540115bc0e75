#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"

namespace loom::worker {

// Tensors by name, in name order (what a safetensors file holds).
using TensorMap = std::map<std::string, at::Tensor>;

// Reads safetensors as Hugging Face writes them: a single `.safetensors` file, or a directory
// holding `model.safetensors` or a sharded `model.safetensors.index.json` with its shards.
// Errors name the file and the tensor.
StatusOr<TensorMap> loadSafetensors(const std::string& path);

// Writes one file (temp file, fsync, rename). Tensors are written contiguous, on the CPU, in
// their own dtype; `metadata` goes to the header's __metadata__.
Status saveSafetensorsFile(const std::string& path, const TensorMap& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` into directory `dir` as HF does: `model.safetensors` when the total fits in
// `maxShardBytes`, else `model-0000i-of-0000n.safetensors` shards and the index. Returns the
// file names written (relative to `dir`).
StatusOr<std::vector<std::string>> saveSafetensorsModel(const std::string& dir, const TensorMap& tensors,
                                                        int64_t maxShardBytes = int64_t(5) << 30);

}  // namespace loom::worker
