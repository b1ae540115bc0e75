#include "planner/placement.h"

#include "tests/catch.h"

using namespace loom::planner;

TEST_CASE("a gang that fits one node goes to the smallest such node", "[planner]") {
  auto p = placeGang(2, {{"big", 8, 8}, {"small", 2, 2}, {"mid", 4, 4}});
  REQUIRE(p.isOk());
  REQUIRE(p->size() == 1);
  CHECK((*p)[0].nodeId == "small");
  CHECK((*p)[0].ranks == std::vector<int>{0, 1});
}

TEST_CASE("a gang larger than any node spreads over the largest - consecutive ranks together", "[planner]") {
  auto p = placeGang(5, {{"a", 2, 2}, {"b", 3, 4}, {"c", 1, 1}});
  REQUIRE(p.isOk());
  REQUIRE(p->size() == 2);
  CHECK((*p)[0].nodeId == "b");
  CHECK((*p)[0].ranks == std::vector<int>{0, 1, 2});
  CHECK((*p)[1].nodeId == "a");
  CHECK((*p)[1].ranks == std::vector<int>{3, 4});
}

TEST_CASE("a gang that does not fit is not placed at all - and the reason says why", "[planner]") {
  auto p = placeGang(4, {{"a", 2, 2}, {"b", 1, 2}});
  REQUIRE_FALSE(p.isOk());
  CHECK(p.status().code() == loom::StatusCode::kResourceExhausted);
  CHECK(p.status().message() == "waiting for 4 free slots: 3 free on 2 nodes (a 2, b 1)");
  CHECK_FALSE(placeGang(1, {}).isOk());
  // More ranks than the nodes have at all: said as such, not as a wait for free slots.
  auto never = placeGang(6, {{"a", 2, 4}});
  REQUIRE_FALSE(never.isOk());
  CHECK(never.status().message() == "waiting for nodes: needs 6 slots, the 1 attached node has 4 in all");
}

TEST_CASE("a node takes whole tensor-parallel groups - or the gang waits, saying why", "[planner]") {
  using loom::planner::NodeLocalGroup;
  // 3 + 3 free slots hold two groups of 2 ranks (one per node), not one group across the nodes.
  auto p = placeGang(4, {{"a", 3, 4}, {"b", 3, 4}}, NodeLocalGroup{2, "deepspeed.tensor_parallel.autotp_size 2"});
  REQUIRE(p.isOk());
  REQUIRE(p->size() == 2);
  CHECK((*p)[0].ranks == std::vector<int>{0, 1});
  CHECK((*p)[1].ranks == std::vector<int>{2, 3});
  auto split = placeGang(4, {{"a", 3, 4}, {"b", 3, 4}}, NodeLocalGroup{4, "deepspeed.tensor_parallel.autotp_size 4"});
  REQUIRE_FALSE(split.isOk());
  CHECK(split.status().code() == loom::StatusCode::kResourceExhausted);
  CHECK(split.status().message() ==
        "waiting for nodes: deepspeed.tensor_parallel.autotp_size 4: each group of 4 ranks must lie inside one node, "
        "and the free slots (a 3, b 3) hold 0 of the 4 ranks that way");
}

TEST_CASE("tensor x sequence parallel groups share a node - a group no node can hold is refused", "[planner]") {
  using loom::planner::checkNodeLocalGroupFits;
  using loom::planner::nodeLocalGroup;
  loom::planner::DeepSpeedConfig ds;
  ds.tensorParallel.size = 2;
  ds.sequenceParallelSize = 4;
  const auto group = nodeLocalGroup(ds);
  CHECK(group.size == 8);
  CHECK(group.what == "deepspeed.tensor_parallel.autotp_size 2 x deepspeed.sequence_parallel_size 4");
  ds.tensorParallel.size = 1;
  CHECK(nodeLocalGroup(ds).what == "deepspeed.sequence_parallel_size 4");
  CHECK(checkNodeLocalGroupFits(group, {}).isOk());  // no node yet: it waits for one
  CHECK(checkNodeLocalGroupFits(group, {{"a", 8, 8}, {"b", 2, 4}}).isOk());
  auto refused = checkNodeLocalGroupFits(group, {{"a", 4, 4}, {"b", 2, 4}});
  CHECK(refused.code() == loom::StatusCode::kFailedPrecondition);
  CHECK(refused.message() ==
        "deepspeed.tensor_parallel.autotp_size 2 x deepspeed.sequence_parallel_size 4: each group of 8 ranks must lie "
        "inside one node, and the largest of the 2 attached nodes has 4 slots");
}
