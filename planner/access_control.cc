#include "planner/access_control.h"

#include <spdlog/spdlog.h>

#include "common/files.h"
#include "common/security/certificates.h"
#include "common/security/credentials.h"
#include "planner/planner_core.h"

namespace loom::planner {

using security::roleName;

namespace {

Status unauthenticated(std::string message) { return {StatusCode::kUnauthenticated, std::move(message)}; }
Status permissionDenied(std::string message) { return {StatusCode::kPermissionDenied, std::move(message)}; }

bool sameFile(const struct stat& a, const struct stat& b) {
  return a.st_ino == b.st_ino && a.st_dev == b.st_dev && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

// The identity a verified client certificate names.
StatusOr<Identity> certificateIdentity(const std::string& pem) {
  auto subject = security::certificateSubject(pem);
  if (!subject.isOk()) return unauthenticated("the client certificate cannot be read: " + subject.status().message());
  const std::string roleText = subject->organizationalUnit.empty() ? "user" : subject->organizationalUnit;
  auto role = security::parseRole(roleText);
  if (!role)
    return unauthenticated(fmt::format("client certificate of \"{}\": OU \"{}\" is not a role (admin, user or node)",
                                       subject->commonName, roleText));
  if (subject->commonName.empty()) return unauthenticated("the client certificate names no user (CN)");
  Identity identity{.user = subject->commonName, .role = *role, .credential = "certificate"};
  if (*role == Role::kUser) {
    if (subject->organization.empty())
      return unauthenticated(fmt::format("client certificate of \"{}\": a user's certificate names its tenant as O",
                                         subject->commonName));
    identity.tenant = subject->organization;
  }
  return identity;
}

}  // namespace

StatusOr<std::unique_ptr<AccessControl>> AccessControl::create(const std::string& tokensFile) {
  std::unique_ptr<AccessControl> access(new AccessControl(tokensFile));
  std::lock_guard lock(access->mu_);
  RETURN_IF_ERROR(access->reloadIfChanged());
  spdlog::info("credentials: {} token(s) from {}", access->fromFile_.size(), tokensFile);
  return access;
}

Status AccessControl::reloadIfChanged() {
  struct stat now {};
  if (::stat(tokensFile_.c_str(), &now) != 0) return errnoStatus("tokens file " + tokensFile_);
  if (sameFile(now, fileStat_)) return Status::ok();
  ASSIGN_OR_RETURN(std::string text, files::readFile(tokensFile_));
  ASSIGN_OR_RETURN(auto entries, security::parseTokensFile(text, tokensFile_));
  fromFile_.clear();
  for (auto& entry : entries) fromFile_[entry.hash] = std::move(entry.identity);
  fileStat_ = now;
  return Status::ok();
}

void AccessControl::addToken(const std::string& token, Identity identity) {
  std::lock_guard lock(mu_);
  inProcess_[security::tokenHash(token)] = std::move(identity);
}

StatusOr<Identity> AccessControl::fromBearer(std::string_view value) {
  const std::string_view prefix = security::kBearerPrefix;
  if (value.substr(0, prefix.size()) != prefix) return unauthenticated("the authorization is not \"Bearer TOKEN\"");
  const std::string hash = security::tokenHash(value.substr(prefix.size()));
  std::lock_guard lock(mu_);
  if (Status reloaded = reloadIfChanged(); !reloaded.isOk()) {
    if (reloaded.message() != lastReloadError_)
      spdlog::error("{}; the tokens read before stay in force", reloaded.message());
    lastReloadError_ = reloaded.message();
  }
  if (auto found = fromFile_.find(hash); found != fromFile_.end()) return found->second;
  if (auto found = inProcess_.find(hash); found != inProcess_.end()) return found->second;
  return unauthenticated("the bearer token is not one this planner knows (revoked, mistyped, or another "
                         "planner's)");
}

StatusOr<Identity> AccessControl::authenticateHttp(std::string_view authorization) {
  if (authorization.empty())
    return unauthenticated("the request carries no credentials: a bearer token (\"Authorization: Bearer TOKEN\")");
  return fromBearer(authorization);
}

StatusOr<Identity> AccessControl::authenticate(const grpc::ServerContextBase& ctx) {
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find(security::kAuthorizationKey); it != metadata.end())
    return fromBearer(std::string_view(it->second.data(), it->second.size()));
  if (auto auth = ctx.auth_context(); auth && auth->IsPeerAuthenticated()) {
    auto pems = auth->FindPropertyValues("x509_pem_cert");
    if (!pems.empty()) {
      std::string pem(pems.front().data(), pems.front().size());
      std::lock_guard lock(mu_);
      if (auto cached = certificates_.find(pem); cached != certificates_.end()) return cached->second;
      if (certificates_.size() >= kMaxCachedCertificates) certificates_.clear();
      auto identity = certificateIdentity(pem);
      certificates_.emplace(std::move(pem), identity);
      return identity;
    }
  }
  return unauthenticated("the call carries no credentials: a bearer token (\"authorization: Bearer TOKEN\"; "
                         "loomctl --token-file) or a client certificate (loomctl --cert and --key over TLS)");
}

StatusOr<std::string> ensureGeneratedTokens(const std::string& stateDir) {
  const std::string path = stateDir + "/tokens";
  if (files::exists(path)) return path;
  RETURN_IF_ERROR(files::makeDirs(stateDir));
  std::string lines = "# Generated by the planner on its first start: one credential per line,\n"
                      "# sha256:HASH USER TENANT ROLE. The tokens themselves are in admin.token and node.token.\n";
  for (auto [name, role] : {std::pair{"admin", Role::kAdmin}, std::pair{"node", Role::kNode}}) {
    ASSIGN_OR_RETURN(std::string token, security::generateToken());
    RETURN_IF_ERROR(files::writeFileAtomic(stateDir + "/" + name + ".token", token + "\n", 0600));
    security::TokenEntry entry{.hash = security::tokenHash(token),
                               .identity = {.user = role == Role::kNode ? "*" : "admin", .role = role}};
    lines += security::tokensFileLine(entry);
  }
  RETURN_IF_ERROR(files::writeFileAtomic(path, lines, 0600));
  return path;
}

// ---- the rules ----------------------------------------------------------------------------------

Status requireRole(const Identity& caller, std::initializer_list<Role> roles, std::string_view what) {
  for (Role role : roles)
    if (caller.role == role) return Status::ok();
  std::string allowed;
  for (Role role : roles) allowed += (allowed.empty() ? "" : " or ") + std::string(roleName(role));
  return permissionDenied(fmt::format("{} may not {}: that needs the role {}", caller.describe(), what, allowed));
}

Status mayActOnJob(const Identity& caller, const std::string& jobId, const std::string& jobTenant,
                   std::string_view action) {
  if (caller.role == Role::kAdmin) return Status::ok();
  if (caller.role == Role::kUser && caller.tenant == jobTenant) return Status::ok();
  if (caller.role == Role::kNode)
    return requireRole(caller, {Role::kAdmin, Role::kUser}, std::string(action) + " jobs");
  return permissionDenied(fmt::format("job {} belongs to {}; {} may not {} it", jobId,
                                      jobTenant.empty() ? "no tenant (an admin's)" : "tenant " + jobTenant,
                                      caller.describe(), action));
}

Status mayAttachAs(const Identity& caller, const std::string& nodeId) {
  RETURN_IF_ERROR(requireRole(caller, {Role::kNode}, "attach a node"));
  if (caller.user != "*" && caller.user != nodeId)
    return permissionDenied(fmt::format("the credential of node {} may not attach as node {}", caller.user, nodeId));
  return Status::ok();
}

StatusOr<Identity> CallGate::caller(const grpc::ServerContextBase& ctx, std::initializer_list<Role> roles,
                                    std::string_view what) {
  ASSIGN_OR_RETURN(Identity identity, access_->authenticate(ctx));
  RETURN_IF_ERROR(requireRole(identity, roles, what));
  return identity;
}

const TenantPolicy* CallGate::policyOf(const std::string& tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? nullptr : &it->second;
}

Status CallGate::confineSpec(const Identity& caller, const std::string& specJson) const {
  if (caller.role != Role::kUser) return Status::ok();
  auto spec = nlohmann::json::parse(specJson, nullptr, /*allow_exceptions=*/false);
  if (!spec.is_object()) return Status::ok();  // the spec's parser says what is wrong with it
  return checkSpecPaths(spec, caller.tenant, policyOf(caller.tenant));
}

Status CallGate::confinePath(const Identity& caller, const std::string& field, const std::string& path) const {
  if (caller.role != Role::kUser) return Status::ok();
  return checkPath(field, path, caller.tenant, policyOf(caller.tenant));
}

void CallGate::checkJob(const grpc::ServerContextBase& ctx, const std::string& jobId, std::string_view action,
                        std::function<void(const Status&)> done) {
  auto identity = access_->authenticate(ctx);
  if (!identity.isOk()) return done(identity.status());
  auto job = core_->job(jobId);
  if (!job.isOk()) return done(job.status());
  done(mayActOnJob(*identity, jobId, (*job)->tenant, action));
}

}  // namespace loom::planner
