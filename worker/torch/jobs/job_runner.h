#pragma once

#include <functional>
#include <memory>

#include <c10/core/Device.h>

#include "common/status.h"
#include "planner/job_spec.h"
#include "planner/plan.h"
#include "worker/rank_context.h"
#include "worker/torch/parallel/rank_mesh.h"
#include "worker/torch/parallel/world.h"
#include "worker/torch_runtime.h"

namespace loom::worker {

// What every job kind that executes a Plan starts from, set up once per rank: libtorch's threads
// (the node's cores shared among its ranks), the kernel plugins, the attempt's world and the
// mesh's communicators, and the device. Members are destroyed mesh first, world last.
struct RankSetup {
  const RankContext& context;
  const planner::JobSpec& spec;
  const planner::Plan& plan;
  // The Plan as this rank executes it (planner::planOfRank): under expert parallelism its own
  // experts only. The model and the ZeRO engines are built from it.
  planner::Plan local;
  TorchRuntime::ProgressFn progress;
  TorchRuntime::ServeRolloutFn serveRollout;
  bool (*preemptionRequested)() = nullptr;  // TorchRuntime::JobHooks'
  std::function<void(const std::string&)> notice;  // TorchRuntime::JobHooks'
  at::Device device;
  World world;
  RankMesh mesh;
};

// A job kind's runner on one rank. Built from the rank's set-up, which it may keep a reference to.
class JobRunner {
 public:
  virtual ~JobRunner() = default;
  virtual Status run() = 0;
};
using JobRunnerFactory = StatusOr<std::unique_ptr<JobRunner>> (*)(RankSetup& rank);

// Sets the rank up, then runs the runner registered for spec.kind (job_runner.cc holds the table:
// train, eval). Errors name what failed.
Status runPlannedJob(const RankContext& context, const planner::JobSpec& spec, const planner::Plan& plan,
                     const TorchRuntime::JobHooks& hooks);

}  // namespace loom::worker
