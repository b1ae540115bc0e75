#include "worker/checkpoint/shard_layout.h"

#include <vector>

#include "tests/catch.h"

namespace loom::checkpoint {
namespace {

// Every element of the piece, by walking the runs: where it lies in the whole parameter.
std::vector<int64_t> wholeIndices(const ShardLayout& layout, int64_t offset, int64_t length) {
  std::vector<int64_t> out;
  int64_t expectPiece = offset;
  for (const ElementRun& run : wholeRuns(layout, offset, length)) {
    REQUIRE(run.piece == expectPiece);
    for (int64_t i = 0; i < run.length; ++i) out.push_back(run.whole + i);
    expectPiece += run.length;
  }
  return out;
}

// The same by the definition: the piece's row r along `dim` is row start_j + index * size_j + (r -
// pieceStart_j) of the whole, for the packed sub-parameter j that holds r.
std::vector<int64_t> byDefinition(const ShardLayout& l) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < l.dim; ++d) outer *= l.local[d];
  for (size_t d = l.dim + 1; d < l.local.size(); ++d) inner *= l.local[d];
  std::vector<int64_t> rowOf;
  int64_t wholeStart = 0;
  for (int64_t size : l.pieceSizes()) {
    for (int64_t r = 0; r < size; ++r) rowOf.push_back(wholeStart + l.index * size + r);
    wholeStart += size * l.parts;
  }
  std::vector<int64_t> out;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t row : rowOf)
      for (int64_t i = 0; i < inner; ++i) out.push_back((o * l.whole[l.dim] + row) * inner + i);
  return out;
}

TEST_CASE("a whole parameter is one run", "[checkpoint]") {
  ShardLayout l{.whole = {6, 4}, .local = {6, 4}};
  const auto runs = wholeRuns(l, 5, 10);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].piece == 5);
  CHECK(runs[0].whole == 5);
  CHECK(runs[0].length == 10);
}

TEST_CASE("a column piece is one run at its rows; a row piece one run per row", "[checkpoint]") {
  ShardLayout column{.whole = {8, 3}, .local = {4, 3}, .dim = 0, .parts = 2, .index = 1};
  const auto runs = wholeRuns(column, 0, 12);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].whole == 12);
  CHECK(wholeIndices(column, 0, 12) == byDefinition(column));

  ShardLayout row{.whole = {3, 8}, .local = {3, 4}, .dim = 1, .parts = 2, .index = 1};
  CHECK(wholeRuns(row, 0, 12).size() == 3);
  CHECK(wholeIndices(row, 0, 12) == byDefinition(row));
}

TEST_CASE("packed sub-parameters are cut each on its own, and any part of a piece maps", "[checkpoint]") {
  // q | k | v packed along dim 0 ([8, 4, 4] rows per piece over 2 ranks), 3 columns.
  ShardLayout qkv{.whole = {32, 3}, .local = {16, 3}, .dim = 0, .parts = 2, .index = 1, .subParams = {8, 4, 4}};
  const auto all = byDefinition(qkv);
  CHECK(wholeIndices(qkv, 0, 48) == all);
  // A ZeRO fragment of the piece: elements [7, 31).
  CHECK(wholeIndices(qkv, 7, 24) == std::vector<int64_t>(all.begin() + 7, all.begin() + 31));
  // Split along the last of three dimensions, from the middle of a row.
  ShardLayout three{.whole = {2, 3, 8}, .local = {2, 3, 2}, .dim = 2, .parts = 4, .index = 2};
  const auto every = byDefinition(three);
  CHECK(wholeIndices(three, 3, 7) == std::vector<int64_t>(every.begin() + 3, every.begin() + 10));
}

}  // namespace
}  // namespace loom::checkpoint
