#include "worker/torch/model/paged_attention.h"

#include <algorithm>
#include <optional>

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

// On a GPU in 16-bit floats: the sequences from `first` on, at once, through flash attention's
// variable-length form over their keys and values gathered from the cache (flash attention aligns
// a query block shorter than its keys to their end, which is where a chunk's tokens sit).
bool varlenServes(const at::Tensor& q) {
  const bool halfPrecision = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  return q.is_cuda() && halfPrecision && q.size(2) % 8 == 0 && q.size(2) <= 256;
}

at::Tensor attendVarlen(const at::Tensor& q, const at::Tensor& keyCache, const at::Tensor& valueCache,
                        const PagedSequences& s, int64_t first) {
  const int64_t count = s.numSequences() - first;
  int64_t maxQuery = 0, maxKey = 0;
  for (int64_t i = first; i < s.numSequences(); ++i) {
    maxQuery = std::max(maxQuery, s.queryStarts[i + 1] - s.queryStarts[i]);
    maxKey = std::max(maxKey, s.contextLensHost[i]);
  }
  at::Tensor slots, cumQuery, cumKey;
  if (s.promptKeySlots.defined() && first == s.numSingleQuery) {
    slots = s.promptKeySlots, cumQuery = s.promptQueryStarts, cumKey = s.promptKeyStarts;
  } else {
    std::vector<int64_t> queryStarts, keyStarts{0};
    for (int64_t i = first; i < s.numSequences(); ++i) {
      queryStarts.push_back(s.queryStarts[i] - s.queryStarts[first]);
      keyStarts.push_back(keyStarts.back() + s.contextLensHost[i]);
    }
    queryStarts.push_back(s.queryStarts.back() - s.queryStarts[first]);
    const auto device = q.device();
    const at::Tensor keyStartsDevice = at::tensor(keyStarts, at::kLong).to(device, /*non_blocking=*/true);
    const at::Tensor lengths = s.contextLens.narrow(0, first, count);
    // Every key's cache slot: sequence i's positions 0..context-1 through its block table.
    const int64_t totalKeys = keyStarts.back();
    const at::Tensor owner = at::repeat_interleave(at::arange(count, lengths.options()), lengths, 0, totalKeys);
    const at::Tensor position = at::arange(totalKeys, lengths.options()) - keyStartsDevice.index_select(0, owner);
    const at::Tensor tables = s.blockTables.narrow(0, first, count);
    const at::Tensor blocks = tables.index({owner, at::floor_divide(position, s.blockSize)});
    slots = blocks * s.blockSize + position.remainder(s.blockSize);
    cumQuery = at::tensor(queryStarts, at::kInt).to(device, true);
    cumKey = at::tensor(keyStarts, at::kInt).to(device, true);
  }
  const at::Tensor k = keyCache.view({-1, keyCache.size(2), keyCache.size(3)}).index_select(0, slots);
  const at::Tensor v = valueCache.view({-1, valueCache.size(2), valueCache.size(3)}).index_select(0, slots);
  const std::optional<int64_t> window =
      s.slidingWindow > 0 ? std::optional<int64_t>(s.slidingWindow - 1) : std::nullopt;
  const std::optional<int64_t> right = s.slidingWindow > 0 ? std::optional<int64_t>(0) : std::nullopt;
  return std::get<0>(at::_flash_attention_forward(q.contiguous(), k, v, cumQuery, cumKey, maxQuery, maxKey, 0.0,
                                                  /*is_causal=*/true, /*return_debug_mask=*/false, std::nullopt,
                                                  window, right));
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
  if (decodes < s.numSequences() && varlenServes(q)) {
    const int64_t begin = s.queryStarts[decodes];
    out.narrow(0, begin, s.numTokens() - begin)
        .copy_(attendVarlen(q.narrow(0, begin, s.numTokens() - begin), keyCache, valueCache, s, decodes));
    return out;
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
