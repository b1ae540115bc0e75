#include "planner/server_flags.h"

#include "common/security/credential_flags.h"

namespace loom::planner {

void addSecurityFlags(CLI::App& app, PlannerServerOptions& options) {
  security::addServerTlsFlags(app, options.tls);
  app.add_option("--tokens", options.tokensFile,
                 "the tokens file: \"sha256:HASH USER TENANT ROLE\" per line (loomctl token create); read again when "
                 "it changes. Default: the planner's own, generated into its state directory (admin.token, "
                 "node.token)");
  app.add_option("--tenants", options.tenantsFile,
                 "the tenants file: each tenant's directories (spec paths must lie under them) and quotas "
                 "(docs/security.md)");
  app.add_flag("--insecure", options.insecure,
               "allow plain text (no TLS) on an address other than loopback; warned about at start and on every "
               "node's attach");
  app.add_flag("--reflection", options.reflection, "serve gRPC server reflection (grpcurl list)");
}

}  // namespace loom::planner
