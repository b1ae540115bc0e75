#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/torch/model/paged_attention.h"

namespace loom::worker {

// The rollout's KV cache: per decoder layer, keys and values [numBlocks, blockSize, Hkv, D] of
// this rank's KV heads, in blocks that the scheduler hands out to sequences.
struct PagedKvCache {
  std::vector<at::Tensor> keys, values;
  int64_t blockSize = 16;
  int64_t maxModelLen = 0;  // positions the cache serves: RoPE's table covers them

  int64_t numBlocks() const { return keys.empty() ? 0 : keys[0].size(0); }
  // Copies block from[i] to block to[i] in every layer (the copy on write of a shared block);
  // both [k] int64 on the cache's device, or undefined when there is nothing to copy.
  void copyBlocks(const at::Tensor& from, const at::Tensor& to);
};

// One step of the rollout as the model computes it: T tokens of S sequences, flat.
struct PagedStep {
  at::Tensor positions;  // [T] int64: each token's position in its sequence
  at::Tensor slots;      // [T] int64: where its key and value go, block * blockSize + offset
  PagedSequences sequences;
  at::Tensor logitRows;  // [R] int64: the tokens whose next-token logits are wanted
};

}  // namespace loom::worker
