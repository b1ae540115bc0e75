#include "planner/zero_partition.h"

#include "tests/catch.h"

using namespace loom::planner;

TEST_CASE("ZeRO 1/2: a flat buffer padded to 2 x dp - cut into equal partitions - parameters may straddle", "[planner]") {
  auto flat = partitionFlat({10, 7, 5}, /*dp=*/2);
  CHECK(flat.flatNumel == 24);  // 22 rounded up to a multiple of 4
  CHECK(flat.padding == 2);
  CHECK(flat.partitionNumel == 12);
  REQUIRE(flat.fragments[0].size() == 2);
  CHECK((flat.fragments[0][0].parameter == 0 && flat.fragments[0][0].length == 10 && flat.fragments[0][0].partitionOffset == 0));
  CHECK((flat.fragments[0][1].parameter == 1 && flat.fragments[0][1].parameterOffset == 0 &&
         flat.fragments[0][1].length == 2 && flat.fragments[0][1].partitionOffset == 10));
  REQUIRE(flat.fragments[1].size() == 2);
  CHECK((flat.fragments[1][0].parameter == 1 && flat.fragments[1][0].parameterOffset == 2 &&
         flat.fragments[1][0].length == 5 && flat.fragments[1][0].partitionOffset == 0));
  CHECK((flat.fragments[1][1].parameter == 2 && flat.fragments[1][1].length == 5 && flat.fragments[1][1].partitionOffset == 5));
}

TEST_CASE("ZeRO 1/2: every element of every parameter lands in exactly one partition", "[planner]") {
  std::vector<int64_t> numels{1, 1000, 3, 4096, 77, 65536, 5};
  for (int dp : {1, 2, 3, 4, 8, 64}) {
    auto flat = partitionFlat(numels, dp);
    std::vector<int64_t> covered(numels.size(), 0);
    for (const auto& rank : flat.fragments) {
      int64_t used = 0;
      for (const auto& f : rank) {
        covered[f.parameter] += f.length;
        CHECK(f.partitionOffset + f.length <= flat.partitionNumel);
        used += f.length;
      }
      CHECK(used <= flat.partitionNumel);
    }
    CHECK(covered == numels);
    CHECK(flat.partitionNumel * dp == flat.flatNumel);
  }
}

TEST_CASE("ZeRO 3: each parameter split on its own - small ones stay whole", "[planner]") {
  auto parts = partitionPerParameter({10, 5, 100000, 6}, /*dp=*/4, /*persistenceThreshold=*/6);
  CHECK((!parts[0].persistent && parts[0].partitionNumel == 3));
  CHECK((parts[1].persistent && parts[1].partitionNumel == 5));
  CHECK((!parts[2].persistent && parts[2].partitionNumel == 25000));
  CHECK(parts[3].persistent);  // "at most" the threshold, as DeepSpeed counts
  // The model-wide cap: once the persistent total would pass it, parameters are partitioned.
  auto capped = partitionPerParameter({5, 5, 5}, 4, 6, /*modelPersistenceThreshold=*/10);
  CHECK((capped[0].persistent && capped[1].persistent && !capped[2].persistent));
}
