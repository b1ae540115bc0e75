#include "planner/tenants.h"

#include <filesystem>

#include "planner/job_spec.h"
#include "planner/json_reader.h"

namespace loom::planner {

namespace fs = std::filesystem;
using nlohmann::json;

StatusOr<TenantPolicies> parseTenantsFile(std::string_view text, const std::string& fileName) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return invalidArgument("{}: not a JSON object of tenants ({{\"team-a\": {{\"roots\": [...]}}}})", fileName);
  TenantPolicies out;
  for (const auto& [name, value] : root.items()) {
    if (!value.is_object()) return invalidArgument("{}: {}: must be an object", fileName, name);
    ObjectReader r(value, name);
    TenantPolicy policy;
    int64_t ranks = 0, gpus = 0, jobs = 0;
    Status read = r.readStrings("roots", &policy.roots, {});
    if (read.isOk()) read = r.readInt("max_ranks", &ranks, false, 0, 1 << 20);
    if (read.isOk()) read = r.readInt("max_gpus", &gpus, false, 0, 1 << 20);
    if (read.isOk()) read = r.readInt("max_running_jobs", &jobs, false, 0, 1 << 20);
    if (read.isOk()) read = r.rejectUnknown();
    if (!read.isOk()) return read.withContext(fileName);
    for (std::string& root : policy.roots) {
      auto resolved = resolvedPath(root);
      if (!resolved.isOk()) return resolved.status().withContext(fmt::format("{}: {}.roots", fileName, name));
      root = std::move(resolved).value();
    }
    policy.quota = {.maxRanks = static_cast<int>(ranks), .maxGpus = static_cast<int>(gpus),
                    .maxRunningJobs = static_cast<int>(jobs)};
    out[name] = std::move(policy);
  }
  return out;
}

StatusOr<std::string> resolvedPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return invalidArgument("\"{}\" is not an absolute path", path);
  // The longest prefix that exists, resolved by the file system; then the rest, as written.
  fs::path existing = fs::path(path);
  std::vector<fs::path> rest;
  std::error_code ec;
  while (!fs::exists(fs::symlink_status(existing, ec)) && existing.has_relative_path()) {
    rest.push_back(existing.filename());
    existing = existing.parent_path();
  }
  fs::path resolved = fs::canonical(existing, ec);
  if (ec) return invalidArgument("\"{}\": {} cannot be resolved: {}", path, existing.string(), ec.message());
  for (auto it = rest.rbegin(); it != rest.rend(); ++it) {
    if (*it == "..") return invalidArgument("\"{}\": \"..\" below {}, which does not exist", path, existing.string());
    if (*it != "." && !it->empty()) resolved /= *it;
  }
  return resolved.string();
}

namespace {

bool isUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

Status permissionDenied(std::string message) { return {StatusCode::kPermissionDenied, std::move(message)}; }

}  // namespace

Status checkPath(const std::string& field, const std::string& path, const std::string& tenant,
                 const TenantPolicy* policy) {
  if (!policy || policy->roots.empty())
    return permissionDenied(fmt::format("{}: tenant {} has no directories its jobs may use (the operator's "
                                        "--tenants file gives each tenant its roots)",
                                        field, tenant));
  auto resolved = resolvedPath(path);
  if (!resolved.isOk()) return permissionDenied(fmt::format("{}: {}", field, resolved.status().message()));
  for (const std::string& root : policy->roots)
    if (isUnder(*resolved, root)) return Status::ok();
  std::string roots;
  for (const std::string& root : policy->roots) roots += (roots.empty() ? "" : ", ") + root;
  const std::string via = *resolved == fs::path(path).lexically_normal().string() ? "" : " (as " + *resolved + ")";
  return permissionDenied(
      fmt::format("{}: {}{} lies outside tenant {}'s directories ({})", field, path, via, tenant, roots));
}

Status checkSpecPaths(const json& spec, const std::string& tenant, const TenantPolicy* policy) {
  for (const SpecPath& p : specPaths(spec)) RETURN_IF_ERROR(checkPath(p.field, p.path, tenant, policy));
  return Status::ok();
}

}  // namespace loom::planner
