// libloom_torch.so: the worker's libtorch side. Torch-facing files never include generated
// protobuf headers: the torch wheel ships protobuf headers of another version.
#include <ATen/Parallel.h>
#include <torch/version.h>

#include "worker/torch/jobs/collective_probe.h"
#include "worker/torch/model/kernels.h"
#include "worker/torch/jobs/job_runner.h"
#include "worker/torch_runtime.h"

namespace loom::worker {
namespace {

class LibTorchRuntime final : public TorchRuntime {
 public:
  // The libtorch version and threads, then the kernel implementations a job would get from
  // LOOM_KERNEL_PATH (a job's kernels.plugins come first).
  std::string describe() const override {
    std::string out = std::string("torch ") + TORCH_VERSION + ", " + std::to_string(at::get_num_threads()) + " threads";
    Status kernels = loadKernels(planner::JobSpec{});
    return out + "\n" + (kernels.isOk() ? "kernels: " + kernelRegistry().describe() : kernels.toString());
  }
  StatusOr<std::string> describeKernels(const planner::JobSpec& spec) override {
    RETURN_IF_ERROR(loadKernels(spec));
    return kernelRegistry().describe();
  }
  Status runCollectiveProbe(const RankContext& context, const planner::JobSpec& spec,
                            const ProgressFn& progress) override {
    return guarded([&] { return loom::worker::runCollectiveProbe(context, spec, progress); });
  }
  Status runJob(const RankContext& context, const planner::JobSpec& spec, const planner::Plan& plan,
                const JobHooks& hooks) override {
    return guarded([&] { return runPlannedJob(context, spec, plan, hooks); });
  }

 private:
  // libtorch reports errors as exceptions; the worker speaks Status.
  template <typename Fn>
  static Status guarded(Fn&& fn) {
    try {
      return fn();
    } catch (const c10::Error& e) {
      return internalError("torch: {}", e.what_without_backtrace());
    } catch (const std::exception& e) {
      return internalError("{}", e.what());
    }
  }
};

}  // namespace
}  // namespace loom::worker

extern "C" loom::worker::TorchRuntime* loom_torch_runtime() {
  static loom::worker::LibTorchRuntime runtime;
  return &runtime;
}
