#pragma once

#include <CLI/CLI.hpp>

#include "planner/planner_server.h"

namespace loom::planner {

// The planner's security flags, shared by loom-planner and `loomd --standalone`: --tls-cert,
// --tls-key, --client-ca, --tokens, --tenants, --insecure and --reflection.
void addSecurityFlags(CLI::App& app, PlannerServerOptions& options);

}  // namespace loom::planner
