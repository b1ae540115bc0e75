#pragma once

#include <map>
#include <string>

#include "common/status.h"
#include "planner/job_spec.h"
#include "planner/tenants.h"

namespace loom::planner {

// What a tenant's running jobs hold now.
struct TenantUsage {
  int ranks = 0;
  int gpus = 0;  // ranks of cuda jobs
  int runningJobs = 0;

  // Adds a job of `spec` that holds its ranks.
  void add(const JobSpec& spec);
};

// At submit: a job larger than its tenant's whole quota would wait for ever.
Status fitsQuota(const JobSpec& spec, const std::string& tenant, const TenantQuota& quota);
// Why a job of `spec` waits for its tenant's quota, given what the tenant's jobs hold; empty
// when it fits.
std::string quotaWait(const JobSpec& spec, const std::string& tenant, const TenantQuota& quota,
                      const TenantUsage& usage);

}  // namespace loom::planner
