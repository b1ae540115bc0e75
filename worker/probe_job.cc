#include "worker/probe_job.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "worker/torch_runtime.h"

namespace loom::worker {

Status runProbe(const RankContext& context, const planner::JobSpec& spec, ReportClient& reports) {
  if (spec.probe.kernels) {
    ASSIGN_OR_RETURN(TorchRuntime * torch, loadTorchRuntime());
    ASSIGN_OR_RETURN(std::string kernels, torch->describeKernels(spec));
    std::printf("rank %d: kernels: %s\n", context.rank, kernels.c_str());
    std::fflush(stdout);
  }
  if (spec.probe.collectives) {
    ASSIGN_OR_RETURN(TorchRuntime * torch, loadTorchRuntime());
    RETURN_IF_ERROR(torch->runCollectiveProbe(
        context, spec, [&](int64_t step, const std::map<std::string, double>& metrics) { reports.progress(step, metrics); }));
  }
  const auto start = std::chrono::steady_clock::now();
  for (int tick = 1; tick <= spec.probe.ticks; ++tick) {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(static_cast<int64_t>(spec.probe.tickMs) * tick));
    double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    reports.progress(tick, {{"probe.tick", tick},
                            {"probe.progress", static_cast<double>(tick) / spec.probe.ticks},
                            {"probe.uptime_s", uptime}});
    std::printf("rank %d: tick %d/%d\n", context.rank, tick, spec.probe.ticks);
    std::fflush(stdout);
  }
  return Status::ok();
}

}  // namespace loom::worker
