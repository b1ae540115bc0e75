#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace loom::security {

// A certificate and its private key, both PEM.
struct PemPair {
  std::string certificate;
  std::string privateKey;
};

// What a certificate names. Loom reads a client certificate's subject as CN = the user (or the
// node id), O = the tenant, OU = the role (admin, user or node).
struct CertificateSubject {
  std::string commonName;
  std::string organization;
  std::string organizationalUnit;
};

struct CertificateRequest {
  CertificateSubject subject;
  std::vector<std::string> altNames;  // subjectAltName: DNS names and IP addresses (a server's)
  bool serverAuth = false;            // extendedKeyUsage: may serve TLS
  bool clientAuth = false;            // extendedKeyUsage: may authenticate as a client
  int days = 365;
};

// A self-signed certificate authority (EC P-256, SHA-256) valid for `days`.
StatusOr<PemPair> createCertificateAuthority(const std::string& commonName, int days);
// A certificate for a new EC P-256 key, signed by `ca`.
StatusOr<PemPair> issueCertificate(const PemPair& ca, const CertificateRequest& request);
// The subject of a PEM certificate.
StatusOr<CertificateSubject> certificateSubject(const std::string& pem);

}  // namespace loom::security
