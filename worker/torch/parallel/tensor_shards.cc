#include "worker/torch/parallel/tensor_shards.h"

#include <ATen/ATen.h>

namespace loom::worker {

at::Tensor takeShard(const at::Tensor& whole, const ShardLayout& layout) {
  if (!layout.sharded()) return whole.contiguous();
  std::vector<at::Tensor> pieces;
  int64_t start = 0;
  for (int64_t piece : layout.pieceSizes()) {
    pieces.push_back(whole.narrow(layout.dim, start + layout.index * piece, piece));
    start += piece * layout.parts;
  }
  return pieces.size() == 1 ? pieces[0].contiguous() : at::cat(pieces, layout.dim);
}

at::Tensor assembleShards(const at::Tensor& all, const ShardLayout& layout, int tpSize) {
  if (!layout.sharded()) return all[0];
  // One piece per index: the first rank of each group of replicas.
  std::vector<at::Tensor> ranks;
  for (int r = 0; r < tpSize; r += layout.replicas) ranks.push_back(all[r]);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (int64_t piece : layout.pieceSizes()) {
    for (const at::Tensor& rank : ranks) out.push_back(rank.narrow(layout.dim, offset, piece));
    offset += piece;
  }
  return at::cat(out, layout.dim);
}

}  // namespace loom::worker
