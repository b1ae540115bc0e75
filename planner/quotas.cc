#include "planner/quotas.h"

#include <fmt/format.h>

namespace loom::planner {

namespace {
int gpusOf(const JobSpec& spec) { return spec.device == DeviceKind::kCuda ? spec.ranks : 0; }
}  // namespace

void TenantUsage::add(const JobSpec& spec) {
  ranks += spec.ranks;
  gpus += gpusOf(spec);
  runningJobs += 1;
}

Status fitsQuota(const JobSpec& spec, const std::string& tenant, const TenantQuota& quota) {
  if (quota.maxRanks > 0 && spec.ranks > quota.maxRanks)
    return failedPrecondition("resources.ranks: {} ranks is more than tenant {}'s quota of {}: the job would wait "
                              "for ever",
                              spec.ranks, tenant, quota.maxRanks);
  if (quota.maxGpus > 0 && gpusOf(spec) > quota.maxGpus)
    return failedPrecondition("resources.ranks: {} GPUs is more than tenant {}'s quota of {}: the job would wait "
                              "for ever",
                              spec.ranks, tenant, quota.maxGpus);
  return Status::ok();
}

std::string quotaWait(const JobSpec& spec, const std::string& tenant, const TenantQuota& quota,
                      const TenantUsage& usage) {
  if (quota.maxRunningJobs > 0 && usage.runningJobs + 1 > quota.maxRunningJobs)
    return fmt::format("waiting for tenant {}'s quota: {} of its {} running jobs are running", tenant,
                       usage.runningJobs, quota.maxRunningJobs);
  if (quota.maxRanks > 0 && usage.ranks + spec.ranks > quota.maxRanks)
    return fmt::format("waiting for tenant {}'s quota: {} ranks asked, {} of its {} in use", tenant, spec.ranks,
                       usage.ranks, quota.maxRanks);
  const int askedGpus = gpusOf(spec);
  if (quota.maxGpus > 0 && askedGpus > 0 && usage.gpus + askedGpus > quota.maxGpus)
    return fmt::format("waiting for tenant {}'s quota: {} GPUs asked, {} of its {} in use", tenant, askedGpus,
                       usage.gpus, quota.maxGpus);
  return "";
}

}  // namespace loom::planner
