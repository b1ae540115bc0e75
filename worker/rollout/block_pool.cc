#include "worker/rollout/block_pool.h"

#include <cstdlib>

namespace loom::rollout {

BlockPool::BlockPool(int32_t numBlocks) : refCounts_(numBlocks, 0) {
  free_.reserve(numBlocks);
  // Block 0 on top: blocks are handed out in order on a fresh pool.
  for (int32_t b = numBlocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> BlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t block = free_.back();
  free_.pop_back();
  refCounts_[block] = 1;
  return block;
}

void BlockPool::share(int32_t block) {
  if (refCounts_[block] <= 0) std::abort();  // sharing a free block: the scheduler lost track of it
  ++refCounts_[block];
}

void BlockPool::release(int32_t block) {
  if (refCounts_[block] <= 0) std::abort();  // releasing a free block twice
  if (--refCounts_[block] == 0) free_.push_back(block);
}

}  // namespace loom::rollout
