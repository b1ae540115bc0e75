#include "common/security/credential_flags.h"

#include <cstdlib>

#include "common/security/tokens.h"

namespace loom::security {

namespace {

std::string fromEnv(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

void addCredentialFlags(CLI::App& app, CredentialFlags& flags, const std::string& whose) {
  flags.caFile = fromEnv("LOOM_CA");
  flags.certFile = fromEnv("LOOM_CERT");
  flags.keyFile = fromEnv("LOOM_KEY");
  flags.tokenFile = fromEnv("LOOM_TOKEN_FILE");
  flags.serverName = fromEnv("LOOM_SERVER_NAME");
  app.add_option("--ca", flags.caFile, "TLS: the CA certificate that signed the planner's (env LOOM_CA)");
  app.add_option("--cert", flags.certFile, "mutual TLS: " + whose + " certificate (env LOOM_CERT)");
  app.add_option("--key", flags.keyFile, "mutual TLS: " + whose + " private key (env LOOM_KEY)");
  app.add_option("--token-file", flags.tokenFile,
                 "a file holding " + whose + " bearer token (env LOOM_TOKEN_FILE; LOOM_TOKEN: the token itself)");
  app.add_option("--server-name", flags.serverName,
                 "TLS: the name the planner's certificate carries, when the address is not it (env "
                 "LOOM_SERVER_NAME)");
}

StatusOr<ClientCredentials> loadCredentials(const CredentialFlags& flags) {
  ClientCredentials credentials{.serverName = flags.serverName};
  if (flags.certFile.empty() != flags.keyFile.empty())
    return invalidArgument("--cert and --key: a client certificate needs both its certificate and its key");
  if (!flags.certFile.empty() && flags.caFile.empty())
    return invalidArgument("--cert: a client certificate needs TLS: give --ca, the CA that signed the planner's "
                           "certificate");
  if (!flags.caFile.empty()) {
    ASSIGN_OR_RETURN(credentials.caPem, readPem(flags.caFile, "--ca"));
  }
  if (!flags.certFile.empty()) {
    ASSIGN_OR_RETURN(credentials.certPem, readPem(flags.certFile, "--cert"));
    ASSIGN_OR_RETURN(credentials.keyPem, readPem(flags.keyFile, "--key"));
  }
  if (!flags.tokenFile.empty()) {
    auto token = readTokenFile(flags.tokenFile);
    if (!token.isOk()) return token.status().withContext("--token-file");
    credentials.token = std::move(token).value();
  } else {
    credentials.token = fromEnv("LOOM_TOKEN");
  }
  return credentials;
}

void addServerTlsFlags(CLI::App& app, ServerTls& tls) {
  auto* cert = app.add_option("--tls-cert", tls.certFile, "serve TLS with this certificate (PEM; loomctl certs init)");
  auto* key = app.add_option("--tls-key", tls.keyFile, "the TLS certificate's private key");
  cert->needs(key);
  key->needs(cert);
  app.add_option("--client-ca", tls.clientCaFile,
                 "accept client certificates signed by this CA (mutual TLS: nodes and users; CN = user, O = tenant, "
                 "OU = role)")
      ->needs(cert);
}

}  // namespace loom::security
