#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace loom::rollout {

// The paged KV cache's blocks, by number: which are free, and how many sequences hold each. A
// block held by several sequences (the n samples of one prompt share its blocks) is copied before
// one of them writes into it (copy on write, Scheduler). Owned by the scheduler's thread.
class BlockPool {
 public:
  explicit BlockPool(int32_t numBlocks);

  int32_t numBlocks() const { return static_cast<int32_t>(refCounts_.size()); }
  int32_t numFree() const { return static_cast<int32_t>(free_.size()); }
  int32_t numUsed() const { return numBlocks() - numFree(); }

  // A free block, now held once; nullopt when none is free.
  std::optional<int32_t> allocate();
  // One more holder of an allocated block.
  void share(int32_t block);
  // One holder fewer; the block is free again when none is left.
  void release(int32_t block);
  int32_t holders(int32_t block) const { return refCounts_[block]; }

 private:
  std::vector<int32_t> refCounts_;
  // Free blocks as a stack: the block freed last is reused first, still warm in the caches.
  std::vector<int32_t> free_;
};

}  // namespace loom::rollout
