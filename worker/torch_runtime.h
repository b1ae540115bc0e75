#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "planner/job_spec.h"
#include "planner/plan.h"
#include "worker/rank_context.h"
#include "worker/rollout/rollout_inbox.h"

namespace loom::worker {

// The part of the worker that needs libtorch lives in libloom_torch.so, loaded on first use:
// libtorch takes a quarter of a second to load, which a rank that never touches a tensor (the
// probe) should not pay, eight times over, at every launch. Same build, same compiler: the
// library hands out C++ objects through one extern "C" entry point.
class TorchRuntime {
 public:
  using ProgressFn = std::function<void(int64_t step, const std::map<std::string, double>& metrics)>;
  // Starts a served rollout's RPC server (loom.v1.RolloutService, worker/rollout_service.h) over
  // `inbox` and reports its address to the planner, which routes clients to it. It serves until
  // the handle is dropped.
  using ServeRolloutFn = std::function<StatusOr<std::shared_ptr<void>>(rollout::RolloutInbox& inbox,
                                                                       const planner::SamplingParams& defaults)>;
  // What the worker's own side lends a job.
  struct JobHooks {
    ProgressFn progress;
    ServeRolloutFn serveRollout;
    // Whether the rank got SIGTERM (worker/preemption.h); null for a kind that does not save on it.
    bool (*preemptionRequested)() = nullptr;
    // An event for the job's history that changes nothing (ReportClient::notice).
    std::function<void(const std::string&)> notice;
  };

  virtual ~TorchRuntime() = default;
  // "torch 2.11.0, 8 threads"
  virtual std::string describe() const = 0;
  // The probe's collective benchmark over every rank of the attempt (worker/torch/jobs/collective_probe.h).
  virtual Status runCollectiveProbe(const RankContext& context, const planner::JobSpec& spec,
                                    const ProgressFn& progress) = 0;
  // The kernel implementations this rank loads for `spec` (its kernels.plugins, LOOM_KERNEL_PATH,
  // the reference) and which one runs each op, several lines.
  virtual StatusOr<std::string> describeKernels(const planner::JobSpec& spec) = 0;
  // A job kind that executes a Plan (train, eval): its runner (worker/torch/jobs/job_runner.h)
  // after the rank set-up every such kind shares.
  virtual Status runJob(const RankContext& context, const planner::JobSpec& spec, const planner::Plan& plan,
                        const JobHooks& hooks) = 0;
};

// Loads the runtime once per process (later calls return the same one). The library is found
// at $LOOM_TORCH_RUNTIME, else ../lib/libloom_torch.so beside the worker binary; the error names
// the path tried and dlopen's reason.
StatusOr<TorchRuntime*> loadTorchRuntime();

}  // namespace loom::worker

// Exported by libloom_torch.so.
extern "C" loom::worker::TorchRuntime* loom_torch_runtime();
