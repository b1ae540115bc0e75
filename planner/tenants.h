#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::planner {

// How much of the cluster one tenant's jobs may hold at once (0: no limit).
struct TenantQuota {
  int maxRanks = 0;
  int maxGpus = 0;  // ranks of cuda jobs
  int maxRunningJobs = 0;
};

// What the operator allows a tenant (loom-planner --tenants FILE): where its specs' paths may
// lie, and its quota.
struct TenantPolicy {
  std::vector<std::string> roots;  // absolute directories, resolved (symlinks) when read
  TenantQuota quota;
};
using TenantPolicies = std::map<std::string, TenantPolicy>;

// The tenants file, a JSON object of tenants:
//   {"team-a": {"roots": ["/data/team-a"], "max_ranks": 16, "max_gpus": 8, "max_running_jobs": 4}}
// Errors name the file and the key.
StatusOr<TenantPolicies> parseTenantsFile(std::string_view text, const std::string& fileName);

// `path` with its symlinks and ".." resolved: the longest part that exists through the file
// system, the rest as written (where ".." is refused: it could climb anywhere once created).
// A relative path is refused.
StatusOr<std::string> resolvedPath(const std::string& path);

// PERMISSION_DENIED naming the field unless every file path of the spec (specPaths) resolves
// under one of the tenant's roots. `policy` null: the tenant has none (every path refused).
Status checkSpecPaths(const nlohmann::json& spec, const std::string& tenant, const TenantPolicy* policy);
// The same for one path named by `field` (UpdateWeights' checkpoint_dir).
Status checkPath(const std::string& field, const std::string& path, const std::string& tenant,
                 const TenantPolicy* policy);

}  // namespace loom::planner
