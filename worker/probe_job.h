#pragma once

#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/rank_context.h"
#include "worker/report_client.h"

namespace loom::worker {

// The probe job: proves that a rank starts, reports and ends on the allocation. With
// `probe.kernels` each rank first prints the kernel implementations it loads; with
// `probe.collectives` it then connects every rank and benchmarks the collectives (loading the
// torch runtime); then it sends `probe.ticks` progress reports `probe.tick_ms` apart.
Status runProbe(const RankContext& context, const planner::JobSpec& spec, ReportClient& reports);

}  // namespace loom::worker
