#include "planner/rank_services.h"

#include <fmt/format.h>

#include "common/files.h"
#include "common/security/tokens.h"

namespace loom::planner {
namespace {

// A certificate per attempt, for as long as an attempt may run.
constexpr int kCertificateDays = 365;
constexpr int kCaDays = 3650;

StatusOr<std::string> loadOrMakeKey(const std::string& path) {
  if (!files::exists(path)) {
    ASSIGN_OR_RETURN(std::string key, security::generateToken());
    RETURN_IF_ERROR(files::writeFileAtomic(path, key + "\n", 0600));
  }
  return security::readTokenFile(path);
}

StatusOr<security::PemPair> loadOrMakeCa(const std::string& certPath, const std::string& keyPath) {
  if (!files::exists(certPath) || !files::exists(keyPath)) {
    ASSIGN_OR_RETURN(security::PemPair ca, security::createCertificateAuthority("loom-planner rank services", kCaDays));
    // The key first: a certificate without its key would be kept, and useless, on a retry.
    RETURN_IF_ERROR(files::writeFileAtomic(keyPath, ca.privateKey, 0600));
    RETURN_IF_ERROR(files::writeFileAtomic(certPath, ca.certificate, 0644));
  }
  security::PemPair ca;
  ASSIGN_OR_RETURN(ca.certificate, security::readPem(certPath, "the rank services' CA certificate"));
  ASSIGN_OR_RETURN(ca.privateKey, security::readPem(keyPath, "the rank services' CA key"));
  return ca;
}

std::string attemptKey(const std::string& jobId, int attempt) { return jobId + "/" + std::to_string(attempt); }

}  // namespace

StatusOr<RankServiceAuthority> RankServiceAuthority::open(const std::string& stateDir) {
  RankServiceAuthority authority;
  ASSIGN_OR_RETURN(authority.key_, loadOrMakeKey(stateDir + "/service.key"));
  ASSIGN_OR_RETURN(authority.ca_, loadOrMakeCa(stateDir + "/service-ca.crt", stateDir + "/service-ca.key"));
  return authority;
}

std::string RankServiceAuthority::token(const std::string& jobId, int attempt) const {
  return security::hmacSha256Hex(key_, attemptKey(jobId, attempt));
}

std::string RankServiceAuthority::serverName(const std::string& jobId, int attempt) const {
  // Job names may hold characters a DNS name may not: the name carries a digest of the id.
  const std::string digest = security::hmacSha256Hex(key_, "name:" + jobId).substr(0, 24);
  return fmt::format("attempt-{}.{}.rank.loom", attempt, digest);
}

StatusOr<security::PemPair> RankServiceAuthority::issue(const std::string& jobId, int attempt) const {
  return security::issueCertificate(
      ca_, {.subject = {.commonName = serverName(jobId, attempt), .organization = "", .organizationalUnit = ""},
            .altNames = {serverName(jobId, attempt)},
            .serverAuth = true,
            .clientAuth = false,
            .days = kCertificateDays});
}

security::ClientCredentials RankServiceAuthority::client(const std::string& jobId, int attempt) const {
  return {.caPem = ca_.certificate, .certPem = "", .keyPem = "", .token = token(jobId, attempt),
          .serverName = serverName(jobId, attempt)};
}

}  // namespace loom::planner
