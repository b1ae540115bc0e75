#include "worker/torch/jobs/step_profiler.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>

namespace loom::worker {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// Kernel names to the part of a step they serve, the first match winning: the grouping of
// bench/gpu/hf_reference.py, so that its table and this one compare row by row.
struct Category {
  const char* name;
  std::vector<const char*> keys;
};
const std::vector<Category>& categories() {
  static const std::vector<Category> table{
      {"communication (NCCL)", {"nccl"}},
      {"attention", {"flash", "fmha", "attention", "sdpa"}},
      {"softmax and loss over the vocabulary", {"softmax", "nll_loss", "cross_entropy", "crossentropy", "logprob", "vocab"}},
      {"optimizer", {"multi_tensor", "adam", "foreach", "norm_kernel"}},
      {"matmul", {"gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90"}},
      {"dtype copies", {"copy"}},
      {"copies between host and device, memsets", {"memcpy", "memset"}},
  };
  return table;
}

std::string categorize(const std::string& kernel) {
  std::string lower = kernel;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& category : categories()) {
    for (const char* key : category.keys)
      if (lower.find(key) != std::string::npos) return category.name;
  }
  return "norms, activations, rope and other elementwise";
}

std::string shortened(std::string name, size_t width = 90) {
  for (char& c : name)
    if (c == '|') c = '/';  // markdown table cells
  return name.size() <= width ? name : name.substr(0, width - 3) + "...";
}

ProfilerConfig kinetoConfig() {
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/false, /*profile_memory=*/false,
                        /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false);
}

std::set<ActivityType> activities(c10::Device device) {
  if (device.is_cuda()) return {ActivityType::CUDA};
  return {ActivityType::CPU};
}

std::vector<std::pair<std::string, double>> byTime(const std::map<std::string, double>& totals) {
  std::vector<std::pair<std::string, double>> rows(totals.begin(), totals.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return rows;
}

}  // namespace

StepProfiler::StepProfiler(c10::Device device) : device_(device) {
  // Kineto must be prepared before it is enabled (enabling alone crashes). On a machine without
  // a GPU, preparing logs one harmless "gpuGetDeviceCount failed" line of Kineto's own.
  profiler::prepareProfiler(kinetoConfig(), activities(device_));
  profiler::enableProfiler(kinetoConfig(), activities(device_));
  recording_ = true;
}

StepProfiler::~StepProfiler() {
  if (recording_) profiler::disableProfiler();
}

std::string StepProfiler::report(double wallMs) {
  std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  recording_ = false;
  const bool gpu = device_.is_cuda();
  std::map<std::string, double> byKernel, byCategory;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // device events, [start, end) in ns
  for (const auto& event : result->events()) {
    const bool onDevice = event.deviceType() == c10::DeviceType::CUDA;
    if (gpu != onDevice) continue;
    const std::string name = event.name();
    // On the CPU: ATen's operators and Loom's own named scopes (its collectives inside autograd).
    if (!gpu && name.rfind("aten::", 0) != 0 && name.rfind("loom::", 0) != 0) continue;
    const double ms = static_cast<double>(event.durationNs()) / 1e6;
    byKernel[name] += ms;
    if (gpu) {
      byCategory[categorize(name)] += ms;
      spans.emplace_back(event.startNs(), event.endNs());
    }
  }
  // Busy: the time some stream had work, overlaps counted once (NCCL's and the offload's copies
  // run on streams of their own beside the compute).
  std::sort(spans.begin(), spans.end());
  double busyMs = 0;
  uint64_t coveredTo = 0;
  for (const auto& [start, end] : spans) {
    const uint64_t from = std::max(start, coveredTo);
    if (end > from) busyMs += static_cast<double>(end - from) / 1e6;
    coveredTo = std::max(coveredTo, end);
  }
  std::string out;
  if (gpu) {
    out += fmt::format("GPU busy {:.2f} ms of the step's {:.2f} ms\n\n", busyMs, wallMs);
    // Parts on different streams can overlap: their times may add up to more than the busy time.
    out += "| part of the step | GPU ms | of the step |\n|---|---|---|\n";
    for (const auto& [name, ms] : byTime(byCategory))
      out += fmt::format("| {} | {:.2f} | {:.1f}% |\n", name, ms, 100 * ms / wallMs);
    out += fmt::format("| GPU idle (launch gaps, host work) | {:.2f} | {:.1f}% |\n\n", wallMs - busyMs,
                       100 * (wallMs - busyMs) / wallMs);
  }
  out += gpu ? "| kernel | GPU ms | of the step |\n|---|---|---|\n"
             : "| ATen operator or Loom scope (inclusive) | ms | of the step |\n|---|---|---|\n";
  int shown = 0;
  for (const auto& [name, ms] : byTime(byKernel)) {
    if (++shown > 20) break;
    out += fmt::format("| {} | {:.2f} | {:.1f}% |\n", shortened(name), ms, 100 * ms / wallMs);
  }
  return out;
}

}  // namespace loom::worker
