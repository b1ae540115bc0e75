#pragma once

#include <cstdint>
#include <functional>
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

// A tensor to write, known before its data: what a file's header needs.
struct TensorEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
// Hands over the data of entries[i], in the entry's dtype and shape (on any device).
using TensorProducer = std::function<StatusOr<at::Tensor>(size_t i)>;

// saveSafetensorsModel, tensor by tensor: the headers come from `entries`, then each tensor's bytes
// as `produce` hands them over, in name order, so that at most one tensor is held at a time (a
// model larger than any rank's memory is written by gathering one tensor after another). With
// `write` false nothing is written, but `produce` is still called for every entry in the same
// order: the ranks that take part in gathering the tensors without writing them. A tensor whose
// dtype or shape is not its entry's is an error naming it.
StatusOr<std::vector<std::string>> streamSafetensorsModel(const std::string& dir, std::vector<TensorEntry> entries,
                                                          const TensorProducer& produce, bool write,
                                                          int64_t maxShardBytes = int64_t(5) << 30);

}  // namespace loom::worker
