#include "planner/mesh.h"

#include <set>

#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

using Groups = std::vector<std::vector<int>>;

TEST_CASE("mesh: tp varies fastest - then sp - then dp", "[planner]") {
  auto mesh = Mesh::create(/*world=*/16, /*tp=*/2, /*sp=*/2, /*ep=*/1);
  REQUIRE(mesh.isOk());
  CHECK(mesh->dp() == 4);
  auto c = mesh->coordinates(13);  // 13 = ((3 * 2) + 0) * 2 + 1
  CHECK((c.dp == 3 && c.sp == 0 && c.tp == 1));
  CHECK(mesh->rankAt(c) == 13);
  CHECK(mesh->group(MeshAxis::kTensor, 13) == std::vector<int>{12, 13});
  CHECK(mesh->group(MeshAxis::kSequence, 13) == std::vector<int>{13, 15});
  CHECK(mesh->group(MeshAxis::kData, 13) == std::vector<int>{1, 5, 9, 13});
  CHECK(mesh->group(MeshAxis::kDenseData, 13) == std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15});
  CHECK(mesh->groups(MeshAxis::kTensor) == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
}

TEST_CASE("mesh: every axis partitions the world", "[planner]") {
  auto mesh = Mesh::create(64, 8, 1, 4);
  REQUIRE(mesh.isOk());
  for (auto axis : {MeshAxis::kTensor, MeshAxis::kSequence, MeshAxis::kData, MeshAxis::kDenseData, MeshAxis::kExpert,
                    MeshAxis::kExpertData}) {
    std::multiset<int> seen;
    for (const auto& g : mesh->groups(axis)) seen.insert(g.begin(), g.end());
    INFO(meshAxisName(axis));
    CHECK(seen.size() == 64);
    CHECK(std::set<int>(seen.begin(), seen.end()).size() == 64);
  }
  CHECK(mesh->groups(MeshAxis::kExpert).size() == 16);      // 64 / ep 4
  CHECK(mesh->groups(MeshAxis::kExpertData).size() == 32);  // tp 8 x ep 4
}

TEST_CASE("mesh: expert groups are runs of the dense-data group - expert-data groups its strides", "[planner]") {
  // 8 ranks, tp 2: dense-data groups {0,2,4,6} and {1,3,5,7}; ep 2.
  auto mesh = Mesh::create(8, 2, 1, 2);
  REQUIRE(mesh.isOk());
  CHECK(mesh->group(MeshAxis::kExpert, 4) == std::vector<int>{4, 6});
  CHECK(mesh->group(MeshAxis::kExpertData, 4) == std::vector<int>{0, 4});
  CHECK(mesh->group(MeshAxis::kExpert, 3) == std::vector<int>{1, 3});
  CHECK(mesh->group(MeshAxis::kExpertData, 3) == std::vector<int>{3, 7});
}

TEST_CASE("mesh: what does not fit is named", "[planner]") {
  CHECK(Mesh::create(12, 8, 1, 1).status().message() ==
        "resources.ranks 12 cannot be split into deepspeed.tensor_parallel.autotp_size 8 x "
        "deepspeed.sequence_parallel_size 1: 12 is not a multiple of 8");
  CHECK(Mesh::create(16, 2, 2, 3).status().message() ==
        "deepspeed.expert_parallel.autoep_size 3 must divide data parallel x sequence parallel = 4 x 2 = 8"
        " (resources.ranks 16 over tensor parallel 2): the experts split over ranks that hold the same tensor-parallel piece");
  CHECK(Mesh::create(8, 0, 1, 1).status().code() == StatusCode::kInvalidArgument);
}
