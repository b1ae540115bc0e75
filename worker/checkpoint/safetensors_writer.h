#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::checkpoint {

// A tensor to write, known before its data: what a safetensors header needs.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // safetensors' names: F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL
  std::vector<int64_t> shape;

  int64_t bytes() const;
};

// The bytes of one element of a safetensors dtype; 0 for a name it does not have.
int64_t safetensorsElementBytes(const std::string& dtype);

// Takes a tensor's bytes, in pieces that add up to entry.bytes().
using ByteSink = std::function<Status(const void* data, size_t bytes)>;
// Hands entries[i]'s bytes to `sink`.
using BytesProducer = std::function<Status(size_t i, const ByteSink& sink)>;

// The safetensors format, in one place for every writer (checkpoints, conversion): one file, its
// header from `entries` (in `indices` order, with `metadata` as __metadata__, the data 8-byte
// aligned), then each tensor's bytes as `produce` hands them over, written through a temporary
// file that is fsynced and renamed. A tensor handed over with another size is an error naming it.
Status writeSafetensorsFile(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                            const std::vector<size_t>& indices, const BytesProducer& produce,
                            const std::map<std::string, std::string>& metadata = {});

// How a model directory is cut into files, as Hugging Face cuts one: the tensors in name order,
// `model.safetensors` when they fit in `maxShardBytes`, else `model-0000i-of-0000n.safetensors`
// filled up to the limit (a tensor above it gets a shard of its own) and
// `model.safetensors.index.json`.
struct ShardPlan {
  std::vector<std::string> files;          // one per shard
  std::vector<std::vector<size_t>> shards;  // each shard's entries, in name order
  int64_t totalBytes = 0;
};
ShardPlan planShards(const std::vector<SafetensorsEntry>& entries, int64_t maxShardBytes);
// Shard `s` of the plan, into `dir`.
Status writeShard(const std::string& dir, const ShardPlan& plan, size_t s, const std::vector<SafetensorsEntry>& entries,
                  const BytesProducer& produce);
// The index of a plan of several shards (nothing for one).
Status writeShardIndex(const std::string& dir, const ShardPlan& plan, const std::vector<SafetensorsEntry>& entries);

// The whole model directory: every shard, then the index. Asks `produce` for each tensor once,
// in name order, so that one tensor at a time is held. Returns the files written (relative to
// `dir`).
StatusOr<std::vector<std::string>> writeSafetensorsModel(const std::string& dir,
                                                         const std::vector<SafetensorsEntry>& entries,
                                                         const BytesProducer& produce, int64_t maxShardBytes);

}  // namespace loom::checkpoint
