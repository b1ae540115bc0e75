#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace loom::worker {

// The sequences of one rollout step as attention over the paged KV cache sees them. Each
// sequence has `queries` new tokens in the step (its last ones) and `context` tokens in the cache
// once those are written, in the blocks of its row of blockTables. Single-token sequences (decodes)
// come first: they are attended in one batch, the rest one by one.
struct PagedSequences {
  at::Tensor blockTables;  // [S, maxBlocks] int64 on the device; rows padded with block 0
  at::Tensor contextLens;  // [S] int64 on the device
  std::vector<int64_t> queryStarts;  // [S + 1], on the host: sequence s's tokens are rows [qs[s], qs[s+1]) of q
  std::vector<int64_t> contextLensHost;  // contextLens, on the host
  int64_t numSingleQuery = 0;  // the first sequences, one query token each
  int64_t blockSize = 16;
  int64_t slidingWindow = 0;  // > 0: a query sees the last `slidingWindow` positions only (Mistral)
  // The sequences after the first numSingleQuery (prompt chunks) as flash attention's
  // variable-length form takes them, built once a step rather than in every layer (undefined:
  // attention derives them): every key's cache slot, sequence after sequence from position 0
  // [sum of their contexts] int64, and the int32 offsets of each one's queries and keys [chunks + 1].
  at::Tensor promptKeySlots, promptQueryStarts, promptKeyStarts;

  int64_t numSequences() const { return static_cast<int64_t>(contextLensHost.size()); }
  int64_t numTokens() const { return queryStarts.empty() ? 0 : queryStarts.back(); }
};

// Causal attention of q [T, H, D] (the step's tokens, grouped-query over Hkv heads) over the keys
// and values in the cache, keyCache and valueCache [numBlocks, blockSize, Hkv, D], this step's
// already written. A query at position p of its sequence sees the sequence's keys 0..p. Returns
// [T, H, D]. The libtorch reference: it gathers each sequence's blocks, then runs
// scaled_dot_product_attention.
at::Tensor pagedAttentionReference(const at::Tensor& q, const at::Tensor& keyCache, const at::Tensor& valueCache,
                                   const PagedSequences& sequences);

}  // namespace loom::worker
