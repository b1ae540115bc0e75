#include "worker/checkpoint/shard_layout.h"

#include <algorithm>

namespace loom::checkpoint {

ShardLayout shardLayout(const planner::ParameterSpec& spec, int tpRank, int tpSize) {
  ShardLayout out{.whole = spec.shape, .local = spec.localShape, .dim = spec.splitDim, .subParams = spec.subParams};
  if (out.local.empty()) out.local = out.whole;
  if (!out.sharded()) return out;
  out.replicas = spec.kvReplication;
  out.parts = tpSize / out.replicas;
  out.index = tpRank / out.replicas;
  return out;
}

std::vector<int64_t> ShardLayout::pieceSizes() const {
  return subParams.empty() ? std::vector<int64_t>{local[dim]} : subParams;
}

std::vector<ElementRun> wholeRuns(const ShardLayout& layout, int64_t offset, int64_t length) {
  if (length <= 0) return {};
  if (!layout.sharded()) return {{.piece = offset, .whole = offset, .length = length}};
  // The piece is [outer, local[dim], inner]; each packed sub-parameter j takes rows
  // [pieceStart_j, pieceStart_j + size_j) of the piece and rows wholeStart_j + the same of the
  // whole, whose dimension is whole[dim].
  int64_t inner = 1;
  for (size_t d = layout.dim + 1; d < layout.local.size(); ++d) inner *= layout.local[d];
  const int64_t pieceRows = layout.local[layout.dim], wholeRows = layout.whole[layout.dim];
  const std::vector<int64_t> sizes = layout.pieceSizes();
  std::vector<int64_t> pieceStart, wholeStart;
  for (int64_t p = 0, w = 0; int64_t size : sizes) {
    pieceStart.push_back(p);
    wholeStart.push_back(w + layout.index * size);
    p += size;
    w += size * layout.parts;
  }
  std::vector<ElementRun> runs;
  for (int64_t e = offset, end = offset + length; e < end;) {
    const int64_t outer = e / (pieceRows * inner), row = (e / inner) % pieceRows, within = e % inner;
    const size_t j = std::upper_bound(pieceStart.begin(), pieceStart.end(), row) - pieceStart.begin() - 1;
    const int64_t rowsLeft = pieceStart[j] + sizes[j] - row;
    const int64_t n = std::min(end - e, rowsLeft * inner - within);
    const int64_t whole = (outer * wholeRows + wholeStart[j] + row - pieceStart[j]) * inner + within;
    if (!runs.empty() && runs.back().piece + runs.back().length == e && runs.back().whole + runs.back().length == whole)
      runs.back().length += n;
    else
      runs.push_back({.piece = e, .whole = whole, .length = n});
    e += n;
  }
  return runs;
}

}  // namespace loom::checkpoint
