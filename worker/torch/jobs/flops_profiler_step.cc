#include "worker/torch/jobs/flops_profiler_step.h"

#include <cstdio>
#include <filesystem>

#include "common/files.h"
#include "worker/torch/model/model_setup.h"

namespace loom::worker {

FlopsProfilerStep::Timed::Timed(FlopsProfilerStep& owner, bool profiling, Part part) {
  if (!profiling) return;
  owner_ = &owner;
  part_ = part;
  if (part == kForward) {
    owner.profile_ = std::make_unique<FlopsProfile>(owner.model_.config(), owner.model_.parameters(),
                                                    owner.model_.device());
    owner.model_.setFlopsProfile(owner.profile_.get());
  }
  synchronize(owner.model_.device());
  start_ = std::chrono::steady_clock::now();
}

FlopsProfilerStep::Timed::~Timed() {
  if (!owner_) return;
  synchronize(owner_->model_.device());
  owner_->seconds_[part_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (part_ == kForward) owner_->model_.setFlopsProfile(nullptr);
}

Status FlopsProfilerStep::report(int64_t stepsAfter, int worldSize, int dataParallelSize, int modelParallelSize) {
  if (!profile_) return Status::ok();
  const FlopsReportContext context{.worldSize = worldSize,
                                   .dataParallelSize = dataParallelSize,
                                   .modelParallelSize = modelParallelSize,
                                   .microBatchSize = microBatchSize_,
                                   .profileStep = stepsAfter,
                                   .forwardSeconds = seconds_[kForward],
                                   .backwardSeconds = seconds_[kBackward],
                                   .stepSeconds = seconds_[kStep],
                                   .recomputeFwdFactor = config_.recomputeFwdFactor,
                                   .moduleDepth = static_cast<int>(config_.moduleDepth),
                                   .topModules = static_cast<int>(config_.topModules),
                                   .detailed = config_.detailed};
  const std::string text = flopsProfileReport(*profile_, context);
  profile_.reset();
  if (config_.outputFile.empty()) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return Status::ok();
  }
  const std::string dir = std::filesystem::path(config_.outputFile).parent_path().string();
  if (!dir.empty()) RETURN_IF_ERROR(files::makeDirs(dir).withContext("deepspeed.flops_profiler.output_file"));
  return files::writeFileAtomic(config_.outputFile, text).withContext("deepspeed.flops_profiler.output_file");
}

}  // namespace loom::worker
