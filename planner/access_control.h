#pragma once

#include <sys/stat.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "common/security/tokens.h"
#include "common/status.h"
#include "planner/tenants.h"

namespace loom::planner {

class PlannerCore;
using security::Identity;
using security::Role;

// Who makes a call. Every call but the health check is authenticated by a bearer token (looked
// up by its hash in the tokens file) or by a client certificate that TLS has verified against
// the client CA (CN = user, O = tenant, OU = role). The tokens file is read again whenever it
// changes, so removing a line revokes that token at once; a file that no longer parses is
// refused with a logged error and the previous table stays in force.
class AccessControl {
 public:
  static StatusOr<std::unique_ptr<AccessControl>> create(const std::string& tokensFile);

  // A token known to this process only (standalone's own daemon, loomctl run's client).
  void addToken(const std::string& token, Identity identity);
  // UNAUTHENTICATED naming what was missing or wrong.
  StatusOr<Identity> authenticate(const grpc::ServerContextBase& ctx);
  // The same for an HTTP request's Authorization header (empty: none); tokens only.
  StatusOr<Identity> authenticateHttp(std::string_view authorization);

 private:
  explicit AccessControl(std::string tokensFile) : tokensFile_(std::move(tokensFile)) {}
  Status reloadIfChanged();  // under mu_
  StatusOr<Identity> fromBearer(std::string_view authorization);

  const std::string tokensFile_;
  std::mutex mu_;
  struct stat fileStat_ {};
  std::map<std::string, Identity> fromFile_;   // token hash → who
  std::map<std::string, Identity> inProcess_;  // token hash → who
  std::string lastReloadError_;  // logged once, not on every call
  // Verified client certificates already read (PEM → who): reading one with OpenSSL costs more
  // than the call. Bounded: cleared past kMaxCachedCertificates.
  std::map<std::string, StatusOr<Identity>> certificates_;
  static constexpr size_t kMaxCachedCertificates = 4096;
};

// The planner's own tokens when the operator gives no tokens file: `stateDir`/tokens (created on
// first start with an admin and a node credential), `admin.token` and `node.token` beside it,
// each mode 0600. Returns the tokens file's path.
StatusOr<std::string> ensureGeneratedTokens(const std::string& stateDir);

// ---- the rules ----------------------------------------------------------------------------------

// PERMISSION_DENIED unless the caller has one of `roles`; `what` names the call.
Status requireRole(const Identity& caller, std::initializer_list<Role> roles, std::string_view what);
// Admins act on every job, users on their tenant's; the refusal names the job's tenant (not its
// name or anything else about it).
Status mayActOnJob(const Identity& caller, const std::string& jobId, const std::string& jobTenant,
                   std::string_view action);
// A node credential attaches the node it names (or any node: "*").
Status mayAttachAs(const Identity& caller, const std::string& nodeId);

// The checks a service runs before it acts, in one place.
class CallGate {
 public:
  CallGate(AccessControl* access, PlannerCore* core, TenantPolicies tenants)
      : access_(access), core_(core), tenants_(std::move(tenants)) {}

  // The caller when it holds one of `roles`.
  StatusOr<Identity> caller(const grpc::ServerContextBase& ctx, std::initializer_list<Role> roles,
                            std::string_view what);
  // Calls `done` with OK when the caller (a user or an admin) may `action` job `jobId`, or with
  // the refusal (and NOT_FOUND for a job that does not exist). `done` runs on the core's loop.
  void checkJob(const grpc::ServerContextBase& ctx, const std::string& jobId, std::string_view action,
                std::function<void(const Status&)> done);
  // A spec as submitted, its paths confined to the caller's tenant's roots (tenants.h) when the
  // caller is a user (an admin's are not). Run before any file the spec names is read.
  Status confineSpec(const Identity& caller, const std::string& specJson) const;
  Status confinePath(const Identity& caller, const std::string& field, const std::string& path) const;

 private:
  const TenantPolicy* policyOf(const std::string& tenant) const;

  AccessControl* access_;
  PlannerCore* core_;
  TenantPolicies tenants_;
};

}  // namespace loom::planner
