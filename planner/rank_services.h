#pragma once

#include <string>

#include "common/security/certificates.h"
#include "common/security/credentials.h"
#include "common/status.h"

namespace loom::planner {

// How the planner and an attempt's rank 0 trust each other when the rank serves (RolloutService):
// the planner relays its clients' calls there, and nobody else may call.
//
// - The rank serves TLS with a certificate the planner issues for that attempt alone, signed by a
//   CA of the planner's own (STATE_DIR/service-ca.crt and .key, made on first start); the planner
//   trusts only that CA and expects the attempt's name, so a rank of another attempt, or anything
//   else listening on the port, fails the handshake.
// - The planner calls with a bearer token derived from STATE_DIR/service.key and the attempt
//   (HMAC-SHA256), which the rank checks.
// Both outlive a planner restart: an attempt that keeps running is still reached.
class RankServiceAuthority {
 public:
  // Loads the key and the CA from the state directory, making them (mode 0600) when absent.
  static StatusOr<RankServiceAuthority> open(const std::string& stateDir);

  // The token the planner presents at the attempt's rank services.
  std::string token(const std::string& jobId, int attempt) const;
  // The name in the attempt's certificate: "attempt-N.<digest of the job id>.rank.loom".
  std::string serverName(const std::string& jobId, int attempt) const;
  // A new certificate and key for the attempt's rank 0 to serve with.
  StatusOr<security::PemPair> issue(const std::string& jobId, int attempt) const;
  // What the planner's channel to the attempt's rank 0 carries: the CA, the name and the token.
  security::ClientCredentials client(const std::string& jobId, int attempt) const;

 private:
  std::string key_;
  security::PemPair ca_;
};

}  // namespace loom::planner
