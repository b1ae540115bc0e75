#include "common/files.h"

#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;

TEST_CASE("atomic writes replace the whole file and leave no temporary behind", "[common]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/a/b/state.json";
  REQUIRE(files::makeDirs(dir.path() + "/a/b").isOk());
  REQUIRE(files::writeFileAtomic(path, "first").isOk());
  REQUIRE(files::writeFileAtomic(path, "second").isOk());
  CHECK(files::readFile(path).value() == "second");
  CHECK(files::listFiles(dir.path() + "/a/b") == std::vector<std::string>{path});
}

TEST_CASE("reading a missing file names it", "[common]") {
  auto missing = files::readFile("/nonexistent/loom.json");
  REQUIRE_FALSE(missing.isOk());
  CHECK(missing.status().message().find("/nonexistent/loom.json") != std::string::npos);
  CHECK(files::writeFileAtomic("/nonexistent/dir/x", "y").message().find("/nonexistent/dir/x") != std::string::npos);
}
