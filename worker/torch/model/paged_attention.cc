#include "worker/torch/model/paged_attention.h"

#include <ATen/ATen.h>

namespace loom::worker {

namespace {

// Keys (or values) of sequences [S, maxBlocks] from the cache: [S, maxBlocks * blockSize, Hkv, D].
at::Tensor gatherBlocks(const at::Tensor& cache, const at::Tensor& blockTables) {
  const at::Tensor blocks = cache.index_select(0, blockTables.reshape({-1}));
  return blocks.view({blockTables.size(0), -1, cache.size(2), cache.size(3)});
}

// Which keys [L] each query [Q] at positions [Q] sees (causal, within the window).
at::Tensor visibleKeys(const at::Tensor& queryPositions, int64_t keys, int64_t window) {
  const at::Tensor j = at::arange(keys, queryPositions.options()).unsqueeze(0);
  const at::Tensor p = queryPositions.unsqueeze(1);
  at::Tensor allowed = j <= p;
  if (window > 0) allowed = allowed.logical_and(p - j < window);
  return allowed;
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed) {
  // q [B, H, Q, D], k and v [B, Hkv, L, D]; grouped-query without repeating K and V.
  return at::scaled_dot_product_attention(q, k, v, allowed, /*dropout_p=*/0.0, /*is_causal=*/false,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/q.size(1) != k.size(1));
}

}  // namespace

at::Tensor pagedAttentionReference(const at::Tensor& q, const at::Tensor& keyCache, const at::Tensor& valueCache,
                                   const PagedSequences& s) {
  at::Tensor out = at::empty_like(q);
  const int64_t decodes = s.numSingleQuery;
  const auto longOptions = s.contextLens.options().dtype(at::kLong);
  if (decodes > 0) {
    // One query per sequence, at its last position: it sees every key of its context.
    const at::Tensor tables = s.blockTables.narrow(0, 0, decodes);
    const at::Tensor k = gatherBlocks(keyCache, tables).transpose(1, 2);  // [S, Hkv, L, D]
    const at::Tensor v = gatherBlocks(valueCache, tables).transpose(1, 2);
    const at::Tensor positions = s.contextLens.narrow(0, 0, decodes).to(at::kLong) - 1;  // [S]
    const at::Tensor allowed = visibleKeys(positions, k.size(2), s.slidingWindow).view({decodes, 1, 1, -1});
    const at::Tensor queries = q.narrow(0, 0, decodes).unsqueeze(2);  // [S, H, 1, D]
    out.narrow(0, 0, decodes).copy_(attend(queries, k, v, allowed).squeeze(2));
  }
  for (int64_t i = decodes; i < s.numSequences(); ++i) {
    const int64_t begin = s.queryStarts[i], count = s.queryStarts[i + 1] - begin;
    const int64_t context = s.contextLensHost[i];
    const int64_t blocks = (context + s.blockSize - 1) / s.blockSize;
    const at::Tensor table = s.blockTables.narrow(0, i, 1).narrow(1, 0, blocks);
    const at::Tensor k = gatherBlocks(keyCache, table).narrow(1, 0, context).transpose(1, 2);
    const at::Tensor v = gatherBlocks(valueCache, table).narrow(1, 0, context).transpose(1, 2);
    const at::Tensor positions = at::arange(context - count, context, longOptions);
    const at::Tensor allowed = visibleKeys(positions, context, s.slidingWindow).view({1, 1, count, context});
    const at::Tensor queries = q.narrow(0, begin, count).transpose(0, 1).unsqueeze(0);  // [1, H, Q, D]
    out.narrow(0, begin, count).copy_(attend(queries, k, v, allowed).squeeze(0).transpose(0, 1));
  }
  return out;
}

}  // namespace loom::worker
