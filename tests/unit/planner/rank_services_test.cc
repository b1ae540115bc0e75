#include <sys/stat.h>

#include <cctype>

#include "common/files.h"
#include "planner/rank_services.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::planner;
using loom::testing::TempDir;

namespace {

unsigned modeOf(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

bool dnsSafe(const std::string& name) {
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') return false;
  return true;
}

}  // namespace

TEST_CASE("the rank services' key and CA are made once, private, and outlive a planner restart", "[security]") {
  TempDir dir;
  auto first = RankServiceAuthority::open(dir.path());
  REQUIRE(first.isOk());
  CHECK(modeOf(dir.path() + "/service.key") == 0600);
  CHECK(modeOf(dir.path() + "/service-ca.key") == 0600);
  CHECK(modeOf(dir.path() + "/service-ca.crt") == 0644);

  auto again = RankServiceAuthority::open(dir.path());
  REQUIRE(again.isOk());
  CHECK(again->token("train-1", 2) == first->token("train-1", 2));
  CHECK(again->serverName("train-1", 2) == first->serverName("train-1", 2));
  CHECK(again->client("train-1", 2).caPem == first->client("train-1", 2).caPem);

  TempDir other;
  auto elsewhere = RankServiceAuthority::open(other.path());
  REQUIRE(elsewhere.isOk());
  CHECK(elsewhere->token("train-1", 2) != first->token("train-1", 2));
  CHECK(elsewhere->client("train-1", 2).caPem != first->client("train-1", 2).caPem);
}

TEST_CASE("each attempt has its own token, name and certificate", "[security]") {
  TempDir dir;
  auto authority = RankServiceAuthority::open(dir.path());
  REQUIRE(authority.isOk());
  CHECK(authority->token("serve-1", 1) != authority->token("serve-1", 2));
  CHECK(authority->token("serve-1", 1) != authority->token("serve-2", 1));

  const std::string name = authority->serverName("a job/with odd name", 3);
  CHECK(name.rfind("attempt-3.", 0) == 0);
  CHECK(name.size() > 10);
  CHECK(dnsSafe(name));
  CHECK(name != authority->serverName("a job/with odd name", 4));

  auto certificate = authority->issue("serve-1", 1);
  REQUIRE(certificate.isOk());
  auto subject = security::certificateSubject(certificate->certificate);
  REQUIRE(subject.isOk());
  CHECK(subject->commonName == authority->serverName("serve-1", 1));
  CHECK(certificate->privateKey.find("PRIVATE KEY") != std::string::npos);

  security::ClientCredentials client = authority->client("serve-1", 1);
  CHECK(client.serverName == authority->serverName("serve-1", 1));
  CHECK(client.token == authority->token("serve-1", 1));
  CHECK(client.certPem.empty());
}

TEST_CASE("a damaged rank services CA stops the planner naming the file", "[security]") {
  TempDir dir;
  REQUIRE(RankServiceAuthority::open(dir.path()).isOk());
  REQUIRE(files::writeFileAtomic(dir.path() + "/service-ca.crt", "not a certificate\n").isOk());
  auto reopened = RankServiceAuthority::open(dir.path());
  REQUIRE_FALSE(reopened.isOk());
  CHECK(reopened.status().message().find(dir.path() + "/service-ca.crt") != std::string::npos);
  CHECK(reopened.status().message().find("not PEM") != std::string::npos);
}
