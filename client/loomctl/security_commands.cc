// loomctl certs init / issue and loomctl token create / revoke: the operator's side of
// docs/security.md. Keys are written mode 0600, certificates 0644; nothing is overwritten.
#include <sys/stat.h>

#include <cstdio>

#include "client/loomctl/commands.h"
#include "common/files.h"
#include "common/security/certificates.h"
#include "common/security/credentials.h"
#include "common/security/tokens.h"

namespace loom::loomctl {

namespace {

// Writes a certificate and its key as DIR/NAME.crt and DIR/NAME.key, refusing to replace either.
Status writePair(const std::string& dir, const std::string& name, const security::PemPair& pair) {
  const std::string cert = dir + "/" + name + ".crt", key = dir + "/" + name + ".key";
  for (const std::string& path : {cert, key})
    if (files::exists(path)) return Status(StatusCode::kAlreadyExists, path + " exists: remove it to issue it again");
  RETURN_IF_ERROR(files::makeDirs(dir));
  RETURN_IF_ERROR(files::writeFileAtomic(key, pair.privateKey, 0600));
  RETURN_IF_ERROR(files::writeFileAtomic(cert, pair.certificate, 0644));
  std::printf("%s\n%s\n", cert.c_str(), key.c_str());
  return Status::ok();
}

// "USER:TENANT[:ROLE]" or "USER::admin" (an admin has no tenant).
StatusOr<security::CertificateSubject> clientSubject(const std::string& text) {
  const auto first = text.find(':');
  const std::string user = text.substr(0, first);
  std::string tenant, role = "user";
  if (first != std::string::npos) {
    const auto second = text.find(':', first + 1);
    tenant = text.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
    if (second != std::string::npos) role = text.substr(second + 1);
  }
  auto parsed = security::parseRole(role);
  if (user.empty() || !parsed)
    return invalidArgument("--client \"{}\": write USER:TENANT for a user, USER::admin for an admin", text);
  if (*parsed == security::Role::kUser && tenant.empty())
    return invalidArgument("--client \"{}\": a user needs a tenant (USER:TENANT)", text);
  if (*parsed != security::Role::kUser && !tenant.empty())
    return invalidArgument("--client \"{}\": an {} has no tenant (USER::{})", text, role, role);
  return security::CertificateSubject{.commonName = user, .organization = tenant, .organizationalUnit = role};
}

}  // namespace

int certsCommand(const CertsOptions& options) {
  const std::string caCert = options.dir + "/ca.crt", caKey = options.dir + "/ca.key";
  security::PemPair ca;
  if (options.createCa) {
    auto made = security::createCertificateAuthority("Loom CA", options.days);
    if (!made.isOk()) return reportError(made.status());
    ca = std::move(made).value();
    if (Status written = writePair(options.dir, "ca", ca); !written.isOk()) return reportError(written);
  } else {
    auto cert = files::readFile(caCert);
    auto key = files::readFile(caKey);
    if (!cert.isOk() || !key.isOk())
      return reportError((cert.isOk() ? key.status() : cert.status()).withContext("the CA (loomctl certs init)"));
    ca = {std::move(cert).value(), std::move(key).value()};
  }
  std::vector<std::pair<std::string, security::CertificateRequest>> requests;
  if (options.createCa || !options.plannerNames.empty()) {
    security::CertificateRequest planner{.subject = {.commonName = "loom-planner", .organizationalUnit = "planner"},
                                         .altNames = {"localhost", "127.0.0.1", "::1"},
                                         .serverAuth = true,
                                         .days = options.days};
    for (const auto& name : options.plannerNames) planner.altNames.push_back(name);
    requests.emplace_back("planner", std::move(planner));
  }
  for (const auto& node : options.nodes) {
    // A node's certificate attaches it to the planner, and serves its /metrics over HTTPS
    // (loomd --metrics-tls-cert) under the name "loomd", which scrapers expect (and the node id).
    security::CertificateRequest request{.subject = {.commonName = node, .organizationalUnit = "node"},
                                         .altNames = {"loomd"},
                                         .serverAuth = true,
                                         .clientAuth = true,
                                         .days = options.days};
    if (node != "*") request.altNames.push_back(node);
    requests.emplace_back("nodes/" + (node == "*" ? std::string("any-node") : node), std::move(request));
  }
  for (const auto& client : options.clients) {
    auto subject = clientSubject(client);
    if (!subject.isOk()) return reportError(subject.status());
    requests.emplace_back("clients/" + subject->commonName,
                          security::CertificateRequest{.subject = *subject, .clientAuth = true, .days = options.days});
  }
  for (const auto& [name, request] : requests) {
    auto issued = security::issueCertificate(ca, request);
    if (!issued.isOk()) return reportError(issued.status());
    const auto slash = name.rfind('/');
    const std::string dir = slash == std::string::npos ? options.dir : options.dir + "/" + name.substr(0, slash);
    if (Status written = writePair(dir, name.substr(slash + 1), *issued); !written.isOk()) return reportError(written);
  }
  return 0;
}

int tokenCreateCommand(const TokenOptions& options) {
  auto role = security::parseRole(options.role);
  if (!role) return reportError(invalidArgument("--role \"{}\": admin, user or node", options.role));
  auto token = security::generateToken();
  if (!token.isOk()) return reportError(token.status());
  security::TokenEntry entry{.hash = security::tokenHash(*token),
                             .identity = {.user = options.user, .tenant = options.tenant, .role = *role}};
  std::string text;
  if (files::exists(options.tokensFile)) {
    auto read = files::readFile(options.tokensFile);
    if (!read.isOk()) return reportError(read.status());
    text = std::move(read).value();
    if (!text.empty() && text.back() != '\n') text += '\n';
  }
  text += security::tokensFileLine(entry);
  // The line must parse as the planner will read it (a user without a tenant, a bad name).
  if (auto parsed = security::parseTokensFile(text, options.tokensFile); !parsed.isOk())
    return reportError(parsed.status());
  if (Status written = files::writeFileAtomic(options.tokensFile, text, 0600); !written.isOk())
    return reportError(written);
  std::printf("%s\n", token->c_str());
  std::fprintf(stderr, "loomctl: added %s (%s) to %s; the token above is shown once\n", options.user.c_str(),
               options.role.c_str(), options.tokensFile.c_str());
  return 0;
}

int tokenRevokeCommand(const TokenOptions& options) {
  auto read = files::readFile(options.tokensFile);
  if (!read.isOk()) return reportError(read.status());
  if (auto parsed = security::parseTokensFile(*read, options.tokensFile); !parsed.isOk())
    return reportError(parsed.status());
  // Line by line, so that the operator's comments stay.
  std::string kept;
  int removed = 0;
  size_t begin = 0;
  while (begin < read->size()) {
    size_t end = read->find('\n', begin);
    end = end == std::string::npos ? read->size() : end + 1;
    const std::string line = read->substr(begin, end - begin);
    begin = end;
    auto entry = security::parseTokensFile(line, options.tokensFile);
    if (entry.isOk() && entry->size() == 1 && (*entry)[0].identity.user == options.user) {
      ++removed;
      continue;
    }
    kept += line;
  }
  if (removed == 0) return reportError(notFound("{} holds no token of {}", options.tokensFile, options.user));
  if (Status written = files::writeFileAtomic(options.tokensFile, kept, 0600); !written.isOk())
    return reportError(written);
  std::fprintf(stderr, "loomctl: revoked %d token(s) of %s; the planner reads %s again on the next call\n", removed,
               options.user.c_str(), options.tokensFile.c_str());
  return 0;
}

}  // namespace loom::loomctl
