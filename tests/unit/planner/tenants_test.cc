#include <filesystem>

#include "common/files.h"
#include "planner/tenants.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::planner;
using loom::testing::TempDir;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a tenants file: roots resolved, quotas, every key checked", "[security]") {
  TempDir dir;
  fs::create_directories(dir.path() + "/data/a");
  fs::create_directory_symlink(dir.path() + "/data/a", dir.path() + "/a-link");
  auto tenants = parseTenantsFile(
      R"({"team-a": {"roots": [")" + dir.path() + R"(/a-link"], "max_ranks": 8, "max_running_jobs": 2}, "team-b": {}})",
      "tenants.json");
  REQUIRE(tenants.isOk());
  CHECK(tenants->at("team-a").roots == std::vector<std::string>{fs::canonical(dir.path() + "/data/a").string()});
  CHECK(tenants->at("team-a").quota.maxRanks == 8);
  CHECK(tenants->at("team-a").quota.maxGpus == 0);
  CHECK(tenants->at("team-a").quota.maxRunningJobs == 2);
  CHECK(tenants->at("team-b").roots.empty());

  struct Case {
    std::string text, words;
  };
  for (const Case& c : {Case{"[1]", "not a JSON object of tenants"}, Case{R"({"a": 1})", "a: must be an object"},
                        Case{R"({"a": {"root": []}})", "root"}, Case{R"({"a": {"max_ranks": -1}})", "max_ranks"},
                        Case{R"({"a": {"roots": ["relative/dir"]}})", "is not an absolute path"}}) {
    auto bad = parseTenantsFile(c.text, "/etc/loom/tenants.json");
    INFO(c.text);
    REQUIRE_FALSE(bad.isOk());
    CHECK(contains(bad.status().message(), "/etc/loom/tenants.json"));
    CHECK(contains(bad.status().message(), c.words));
  }
}

TEST_CASE("spec paths are confined to the tenant's roots after symlinks and '..' are resolved", "[security]") {
  TempDir dir;
  const std::string root = fs::canonical(dir.path()).string() + "/team-a";
  fs::create_directories(root + "/data");
  fs::create_directories(dir.path() + "/secret");
  fs::create_directory_symlink(dir.path() + "/secret", root + "/escape");
  TenantPolicy policy{.roots = {root}, .quota = {}};

  CHECK(checkPath("data.train", root + "/data/train.tokens", "team-a", &policy).isOk());
  CHECK(checkPath("train.checkpoint_dir", root + "/new/ckpt", "team-a", &policy).isOk());  // made later
  CHECK(checkPath("data.train", root, "team-a", &policy).isOk());

  struct Case {
    std::string path, words;
  };
  for (const Case& c : {Case{"/etc/passwd", "/etc/passwd lies outside tenant team-a's directories (" + root + ")"},
                        Case{root + "/../secret/x", "lies outside"},
                        Case{root + "/escape/key", "(as " + fs::canonical(dir.path()).string() + "/secret/key)"},
                        Case{root + "-other/x", "lies outside"},
                        Case{root + "/absent/../../secret", "\"..\" below"},
                        Case{"relative/x", "is not an absolute path"}}) {
    Status s = checkPath("model.weights", c.path, "team-a", &policy);
    INFO(c.path << ": " << s.message());
    CHECK(s.code() == StatusCode::kPermissionDenied);
    CHECK(contains(s.message(), "model.weights: "));
    CHECK(contains(s.message(), c.words));
  }
  Status none = checkPath("data.train", root + "/data/x", "team-c", nullptr);
  CHECK(none.code() == StatusCode::kPermissionDenied);
  CHECK(contains(none.message(), "tenant team-c has no directories"));

  // Every path of a spec, the DeepSpeed monitors' too.
  nlohmann::json spec{{"model", {{"config", root + "/data/config.json"}}},
                      {"data", {{"train", root + "/data/t.tokens"}}},
                      {"deepspeed", {{"tensorboard", {{"enabled", true}, {"output_path", "/tmp/tb"}}}}}};
  Status monitors = checkSpecPaths(spec, "team-a", &policy);
  CHECK(monitors.code() == StatusCode::kPermissionDenied);
  CHECK(contains(monitors.message(), "deepspeed.tensorboard.output_path: /tmp/tb lies outside"));
  spec["deepspeed"]["tensorboard"]["output_path"] = root + "/tb";
  CHECK(checkSpecPaths(spec, "team-a", &policy).isOk());
  spec["deepspeed"]["wandb"] = {{"enabled", true}, {"dir", "/tmp"}};
  CHECK(contains(checkSpecPaths(spec, "team-a", &policy).message(), "deepspeed.wandb.dir: /tmp lies outside"));
}
