#include "planner/quotas.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

namespace {
JobSpec jobOf(int ranks, DeviceKind device) {
  JobSpec spec;
  spec.ranks = ranks;
  spec.device = device;
  return spec;
}
}  // namespace

TEST_CASE("a job larger than its tenant's whole quota is refused at submit, naming the field", "[security]") {
  const TenantQuota quota{.maxRanks = 4, .maxGpus = 2, .maxRunningJobs = 1};
  CHECK(fitsQuota(jobOf(4, DeviceKind::kCpu), "team-a", quota).isOk());
  Status ranks = fitsQuota(jobOf(5, DeviceKind::kCpu), "team-a", quota);
  CHECK(ranks.code() == StatusCode::kFailedPrecondition);
  CHECK(ranks.message() == "resources.ranks: 5 ranks is more than tenant team-a's quota of 4: the job would wait for ever");
  CHECK(fitsQuota(jobOf(3, DeviceKind::kCpu), "team-a", quota).isOk());  // GPUs count cuda ranks only
  Status gpus = fitsQuota(jobOf(3, DeviceKind::kCuda), "team-a", quota);
  CHECK(gpus.message() == "resources.ranks: 3 GPUs is more than tenant team-a's quota of 2: the job would wait for ever");
  CHECK(fitsQuota(jobOf(100, DeviceKind::kCuda), "team-b", TenantQuota{}).isOk());  // 0: no bound
}

TEST_CASE("a job waits while its tenant's running jobs hold its quota, with the reason", "[security]") {
  const TenantQuota quota{.maxRanks = 4, .maxGpus = 2, .maxRunningJobs = 2};
  TenantUsage usage;
  CHECK(quotaWait(jobOf(2, DeviceKind::kCuda), "team-a", quota, usage).empty());
  usage.add(jobOf(2, DeviceKind::kCuda));
  CHECK(usage.ranks == 2);
  CHECK(usage.gpus == 2);
  CHECK(usage.runningJobs == 1);
  CHECK(quotaWait(jobOf(1, DeviceKind::kCuda), "team-a", quota, usage) ==
        "waiting for tenant team-a's quota: 1 GPUs asked, 2 of its 2 in use");
  CHECK(quotaWait(jobOf(2, DeviceKind::kCpu), "team-a", quota, usage).empty());
  CHECK(quotaWait(jobOf(3, DeviceKind::kCpu), "team-a", quota, usage) ==
        "waiting for tenant team-a's quota: 3 ranks asked, 2 of its 4 in use");
  usage.add(jobOf(1, DeviceKind::kCpu));
  CHECK(quotaWait(jobOf(1, DeviceKind::kCpu), "team-a", quota, usage) ==
        "waiting for tenant team-a's quota: 2 of its 2 running jobs are running");
}
