#include "worker/job_runners.h"

#include <cstdio>
#include <cstdlib>

#include "worker/convert/convert_job.h"
#include "worker/preemption.h"
#include "worker/probe_job.h"
#include "worker/rollout_service.h"
#include "worker/torch_runtime.h"

namespace loom::worker {

namespace {

// Train, eval and rollout run in libloom_torch.so; their metrics go to the daemon as progress
// reports. A served rollout's RPC server runs on this side, which speaks protobuf, from
// libloom_rollout_service.so.
Status runTorchJob(const RankContext& context, const planner::JobSpec& spec, const planner::Plan* plan,
                   ReportClient& reports) {
  ASSIGN_OR_RETURN(TorchRuntime * torch, loadTorchRuntime());
  TorchRuntime::JobHooks hooks;
  hooks.progress = [&](int64_t step, const std::map<std::string, double>& metrics) { reports.progress(step, metrics); };
  hooks.notice = [&](const std::string& what) { reports.notice(what); };
  hooks.serveRollout = [&](rollout::RolloutInbox& inbox,
                           const planner::SamplingParams& defaults) -> StatusOr<std::shared_ptr<void>> {
    ASSIGN_OR_RETURN(StartRolloutServiceFn start, loadRolloutService());
    ASSIGN_OR_RETURN(RolloutServing serving, start(context.masterAddr, inbox, defaults));
    std::printf("rollout: serving loom.v1.RolloutService at %s (clients call the planner, which routes to it)\n",
                serving.address.c_str());
    std::fflush(stdout);
    reports.serving(serving.address);
    return serving.server;
  };
  // A train job checkpoints on SIGTERM before it exits; the other kinds have nothing to save.
  if (spec.kind == planner::JobKind::kTrain) {
    catchPreemption();
    hooks.preemptionRequested = preemptionRequested;
  }
  return torch->runJob(context, spec, *plan, hooks);
}

// Conversion moves bytes only: it runs without libtorch, in a process of a few MB.
Status runConvert(const RankContext& context, const planner::JobSpec& spec, const planner::Plan*,
                  ReportClient& reports) {
  return runConvertJob(context, spec, reports);
}

Status runProbeJob(const RankContext& context, const planner::JobSpec& spec, const planner::Plan*,
                   ReportClient& reports) {
  return runProbe(context, spec, reports);
}

constexpr JobKindRunner kRunners[] = {
    {planner::JobKind::kProbe, runProbeJob},
    {planner::JobKind::kTrain, runTorchJob},
    {planner::JobKind::kEval, runTorchJob},
    {planner::JobKind::kConvert, runConvert},
    {planner::JobKind::kRollout, runTorchJob},
};

}  // namespace

const JobKindRunner& runnerFor(planner::JobKind kind) {
  for (const auto& runner : kRunners)
    if (runner.kind == kind) return runner;
  std::abort();  // a JobKind without an entry is a build that forgot one: every kind is listed above
}

}  // namespace loom::worker
