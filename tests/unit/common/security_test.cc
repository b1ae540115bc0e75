#include <set>

#include "common/security/certificates.h"
#include "common/security/tokens.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::security;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::string kHash = "sha256:" + std::string(64, 'a');

}  // namespace

TEST_CASE("tokens: 32 random bytes, stored only as their SHA-256", "[security]") {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    auto token = generateToken();
    REQUIRE(token.isOk());
    CHECK(token->rfind("loom_", 0) == 0);
    CHECK(token->size() == 5 + 43);
    CHECK(token->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", 5) ==
          std::string::npos);
    seen.insert(*token);
  }
  CHECK(seen.size() == 100);
  // FIPS 180-2's test vector.
  CHECK(tokenHash("abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("a tokens file: users with tenants, admins and nodes without, comments", "[security]") {
  const std::string text = "# the operator's\n\n" + kHash + "  alice team-a user  # Alice\n" +
                           "sha256:" + std::string(64, 'b') + " root - admin\n" + "sha256:" + std::string(64, 'c') +
                           " * - node\n";
  auto entries = parseTokensFile(text, "tokens");
  REQUIRE(entries.isOk());
  REQUIRE(entries->size() == 3);
  CHECK((*entries)[0].identity.user == "alice");
  CHECK((*entries)[0].identity.tenant == "team-a");
  CHECK((*entries)[0].identity.role == Role::kUser);
  CHECK((*entries)[1].identity.tenant.empty());
  CHECK((*entries)[1].identity.role == Role::kAdmin);
  CHECK((*entries)[2].identity.user == "*");
  // A line written back reads the same.
  auto again = parseTokensFile(tokensFileLine((*entries)[0]) + tokensFileLine((*entries)[1]), "tokens");
  REQUIRE(again.isOk());
  CHECK((*again)[0].identity.describe() == "alice (tenant team-a)");
  CHECK((*again)[1].identity.describe() == "admin root");
}

TEST_CASE("a tokens file's bad lines are refused naming the file and the line", "[security]") {
  struct Case {
    std::string line, words;
  };
  for (const Case& c : {Case{kHash + " alice team-a", "3 fields"},
                        Case{"sha256:abc alice team-a user", "64 lower-case hex"},
                        Case{"sha256:" + std::string(64, 'A') + " alice team-a user", "64 lower-case hex"},
                        Case{kHash + " alice team-a root", "role \"root\""},
                        Case{kHash + " alice - user", "a user needs a tenant"},
                        Case{kHash + " root team-a admin", "an admin has no tenant"},
                        Case{kHash + " al/ice team-a user", "user \"al/ice\""},
                        Case{kHash + " * team-a user", "user \"*\""},
                        Case{kHash + " a t user\n" + kHash + " b t user", "the same token hash"}}) {
    auto parsed = parseTokensFile("# first\n" + c.line + "\n", "/etc/loom/tokens");
    INFO(c.line);
    REQUIRE_FALSE(parsed.isOk());
    CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
    CHECK(contains(parsed.status().message(), "/etc/loom/tokens line "));
    CHECK(contains(parsed.status().message(), c.words));
  }
}

TEST_CASE("certificates: a CA, and a client certificate whose subject names user, tenant and role",
          "[security]") {
  auto ca = createCertificateAuthority("Loom CA", 30);
  REQUIRE(ca.isOk());
  CHECK(contains(ca->certificate, "-----BEGIN CERTIFICATE-----"));
  CHECK(contains(ca->privateKey, "-----BEGIN PRIVATE KEY-----"));
  auto client = issueCertificate(
      *ca, {.subject = {.commonName = "alice", .organization = "team-a", .organizationalUnit = "user"},
            .clientAuth = true,
            .days = 30});
  REQUIRE(client.isOk());
  auto subject = certificateSubject(client->certificate);
  REQUIRE(subject.isOk());
  CHECK(subject->commonName == "alice");
  CHECK(subject->organization == "team-a");
  CHECK(subject->organizationalUnit == "user");
  CHECK(certificateSubject(ca->certificate)->commonName == "Loom CA");

  auto expiredAlready = issueCertificate(*ca, {.subject = {.commonName = "x"}, .days = 0});
  REQUIRE_FALSE(expiredAlready.isOk());
  CHECK(contains(expiredAlready.status().message(), "at least a day"));
  auto notPem = certificateSubject("hello");
  REQUIRE_FALSE(notPem.isOk());
  CHECK(contains(notPem.status().message(), "reading a PEM certificate"));
}
