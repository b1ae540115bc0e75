#include "daemon/gpus.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::daemon;

TEST_CASE("loomd --gpus: indices, an index twice, none; anything else refused naming it", "[daemon]") {
  CHECK(parseGpuList("0,1,2,3").value() == std::vector<int>{0, 1, 2, 3});
  CHECK(parseGpuList("1,1").value() == std::vector<int>{1, 1});
  CHECK(parseGpuList("none").value().empty());
  for (const char* bad : {"", "0,,1", "a", "-1", "1024", "0,1x"}) {
    auto parsed = parseGpuList(bad);
    REQUIRE_FALSE(parsed.isOk());
    CHECK(parsed.status().message().find("is not a GPU index") != std::string::npos);
  }
}

TEST_CASE("free GPUs: the offered ones less those live ranks hold, lowest first", "[daemon]") {
  CHECK(freeGpus({0, 1, 2, 3}, {}) == std::vector<int>{0, 1, 2, 3});
  CHECK(freeGpus({0, 1, 2, 3}, {2, 0}) == std::vector<int>{1, 3});
  // A GPU listed twice is two slots: one rank on it leaves the other.
  CHECK(freeGpus({0, 0, 1}, {0}) == std::vector<int>{0, 1});
  // A rank re-adopted on a GPU this loomd no longer offers takes nothing of the rest.
  CHECK(freeGpus({0, 1}, {5}) == std::vector<int>{0, 1});
  CHECK(visibleDevices({2, 0}) == "2,0");
  CHECK(visibleDevices({}).empty());
}
