#include <sys/stat.h>

#include "common/files.h"
#include "common/security/tokens.h"
#include "planner/access_control.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::planner;
using loom::testing::TempDir;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const Identity kAlice{.user = "alice", .tenant = "team-a", .role = Role::kUser, .credential = "token"};
const Identity kAdmin{.user = "root", .role = Role::kAdmin, .credential = "token"};
const Identity kNode{.user = "n1", .role = Role::kNode, .credential = "certificate"};
const Identity kAnyNode{.user = "*", .role = Role::kNode, .credential = "token"};

}  // namespace

TEST_CASE("a user acts on its tenant's jobs, an admin on all; a refusal names the tenant, not the job",
          "[security]") {
  CHECK(mayActOnJob(kAlice, "train-1", "team-a", "cancel").isOk());
  CHECK(mayActOnJob(kAdmin, "train-1", "team-b", "cancel").isOk());
  CHECK(mayActOnJob(kAdmin, "train-1", "", "cancel").isOk());

  Status other = mayActOnJob(kAlice, "train-1", "team-b", "cancel");
  CHECK(other.code() == StatusCode::kPermissionDenied);
  CHECK(other.message() == "job train-1 belongs to tenant team-b; alice (tenant team-a) may not cancel it");
  Status admins = mayActOnJob(kAlice, "train-1", "", "read");
  CHECK(admins.code() == StatusCode::kPermissionDenied);
  CHECK(contains(admins.message(), "belongs to no tenant (an admin's)"));
  Status node = mayActOnJob(kNode, "train-1", "team-a", "read");
  CHECK(node.code() == StatusCode::kPermissionDenied);
  CHECK(contains(node.message(), "node n1 may not read jobs: that needs the role admin or user"));
}

TEST_CASE("roles: node credentials attach their own node only", "[security]") {
  CHECK(requireRole(kAdmin, {Role::kAdmin}, "drain nodes").isOk());
  Status user = requireRole(kAlice, {Role::kAdmin}, "drain nodes");
  CHECK(user.code() == StatusCode::kPermissionDenied);
  CHECK(user.message() == "alice (tenant team-a) may not drain nodes: that needs the role admin");

  CHECK(mayAttachAs(kNode, "n1").isOk());
  CHECK(mayAttachAs(kAnyNode, "n7").isOk());
  Status other = mayAttachAs(kNode, "n2");
  CHECK(other.code() == StatusCode::kPermissionDenied);
  CHECK(other.message() == "the credential of node n1 may not attach as node n2");
  Status notNode = mayAttachAs(kAdmin, "n1");
  CHECK(notNode.code() == StatusCode::kPermissionDenied);
  CHECK(contains(notNode.message(), "may not attach a node: that needs the role node"));
}

TEST_CASE("a planner without a tokens file generates its own once, readable by its user only", "[security]") {
  TempDir dir;
  auto path = ensureGeneratedTokens(dir.path() + "/state");
  REQUIRE(path.isOk());
  for (const char* name : {"tokens", "admin.token", "node.token"}) {
    struct stat st {};
    REQUIRE(::stat((dir.path() + "/state/" + name).c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
  }
  auto entries = security::parseTokensFile(files::readFile(*path).value(), *path);
  REQUIRE(entries.isOk());
  REQUIRE(entries->size() == 2);
  auto admin = security::readTokenFile(dir.path() + "/state/admin.token");
  REQUIRE(admin.isOk());
  CHECK((*entries)[0].hash == security::tokenHash(*admin));
  CHECK((*entries)[0].identity.role == Role::kAdmin);
  CHECK((*entries)[1].identity.role == Role::kNode);
  // A restart keeps them: clients and nodes keep working.
  REQUIRE(ensureGeneratedTokens(dir.path() + "/state").isOk());
  CHECK(security::readTokenFile(dir.path() + "/state/admin.token").value() == *admin);
}
