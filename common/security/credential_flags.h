#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "common/security/credentials.h"

namespace loom::security {

// A client's credentials as its command line and environment give them (loomctl, loomd).
struct CredentialFlags {
  std::string caFile;      // --ca, LOOM_CA
  std::string certFile;    // --cert, LOOM_CERT
  std::string keyFile;     // --key, LOOM_KEY
  std::string tokenFile;   // --token-file, LOOM_TOKEN_FILE (LOOM_TOKEN holds a token itself)
  std::string serverName;  // --server-name, LOOM_SERVER_NAME
};

// Adds --ca, --cert, --key, --token-file and --server-name to `app`, defaulting to the
// environment. `whose` says whose certificate or token it is ("this node's", "your").
void addCredentialFlags(CLI::App& app, CredentialFlags& flags, const std::string& whose);
// The credentials, the token read from its file (or LOOM_TOKEN when no file is named); errors
// name the file or flag.
StatusOr<ClientCredentials> loadCredentials(const CredentialFlags& flags);

// The server side's flags: --tls-cert, --tls-key and --client-ca.
void addServerTlsFlags(CLI::App& app, ServerTls& tls);

}  // namespace loom::security
