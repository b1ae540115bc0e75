#pragma once

#include <optional>

#include "common/status.h"
#include "planner/job_spec.h"
#include "planner/plan.h"
#include "worker/rank_context.h"
#include "worker/report_client.h"

namespace loom::worker {

// How a rank runs one job kind: the one seam where a kind plugs into the worker. Kinds with a
// Plan (train, eval) run in libloom_torch.so through TorchRuntime::runJob; the probe runs here,
// loading libtorch only for its collective benchmark.
// Whether a kind's launch hands its ranks a compiled Plan (LOOM_PLAN) is the planner's
// planner::jobKindInfo(kind).hasPlan.
struct JobKindRunner {
  planner::JobKind kind;
  Status (*run)(const RankContext& context, const planner::JobSpec& spec, const planner::Plan* plan,
                ReportClient& reports);
};

// The entry for `kind`; every JobKind has one (job_runners.cc, the one table).
const JobKindRunner& runnerFor(planner::JobKind kind);

}  // namespace loom::worker
