#include "worker/torch/jobs/job_runner.h"

#include <cstdio>

#include "worker/torch/jobs/eval_job.h"
#include "worker/torch/jobs/rollout_job.h"
#include "worker/torch/jobs/train_job.h"
#include "worker/torch/model/kernels.h"
#include "worker/torch/model/model_setup.h"

namespace loom::worker {

namespace {

struct RegisteredRunner {
  planner::JobKind kind;
  JobRunnerFactory make;
};

// One entry per job kind that executes a Plan.
constexpr RegisteredRunner kRunners[] = {
    {planner::JobKind::kTrain, makeTrainRunner},
    {planner::JobKind::kEval, makeEvalRunner},
    {planner::JobKind::kRollout, makeRolloutRunner},
};

TensorHome homeOf(const planner::JobSpec& spec) {
  return spec.device == planner::DeviceKind::kCuda ? TensorHome::kCuda : TensorHome::kHost;
}

}  // namespace

Status runPlannedJob(const RankContext& ctx, const planner::JobSpec& spec, const planner::Plan& plan,
                     const TorchRuntime::JobHooks& hooks) {
  const RegisteredRunner* entry = nullptr;
  for (const auto& runner : kRunners)
    if (runner.kind == spec.kind) entry = &runner;
  if (!entry) return invalidArgument("kind: a {} job has no runner in libloom_torch", planner::jobKindName(spec.kind));
  if (plan.mesh.world != ctx.worldSize)
    return failedPrecondition("plan: compiled for {} ranks, but WORLD_SIZE is {}", plan.mesh.world, ctx.worldSize);

  setThreadsForRanks(ctx.localWorldSize);
  RETURN_IF_ERROR(loadKernels(spec));
  RankSetup rank{.context = ctx, .spec = spec, .plan = plan, .local = planner::planOfRank(plan, ctx.rank),
                 .progress = hooks.progress, .serveRollout = hooks.serveRollout,
                 .preemptionRequested = hooks.preemptionRequested, .notice = hooks.notice,
                 .device = rankDevice(spec, ctx.localRank), .world = {}, .mesh = {}};
  if (ctx.worldSize > 1) {
    ASSIGN_OR_RETURN(rank.world, connectWorld(ctx, spec, homeOf(spec)));
  }
  ASSIGN_OR_RETURN(rank.mesh, buildRankMesh(rank.world.comm, plan, ctx.rank));
  ASSIGN_OR_RETURN(std::unique_ptr<JobRunner> runner, entry->make(rank));
  const Status status = runner->run();
  // DeepSpeed's comms_logger: what the job's collectives moved, per op and size, in rank 0's log.
  if (status.isOk() && rank.world.logger && spec.deepspeed.commsLogger.enabled && ctx.rank == 0)
    std::printf("# comms logger\n%s", rank.world.logger->summary().c_str());
  return status;
}

}  // namespace loom::worker
