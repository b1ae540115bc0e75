#include "worker/convert/convert_job.h"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "common/human_bytes.h"
#include "common/process.h"
#include "worker/convert/checkpoint_source.h"
#include "worker/convert/output_dir.h"
#include "worker/convert/to_hf.h"
#include "worker/convert/to_loom.h"

namespace loom::worker {

namespace {

// The convert.layout the target is compiled for: the source's settings where the layout leaves
// them out.
StatusOr<convert::LayoutPlan> targetLayout(const convert::ResumableCheckpoint& source,
                                          const planner::ConvertLayout& layout) {
  const nlohmann::json deepspeed = convert::deepspeedForLayout(source.trainerState().at("deepspeed"), layout);
  return convert::compileLayout(source.model(), deepspeed, layout.ranks, source.frozen(), "convert.layout");
}

void printDone(const ConvertOutput& output, double seconds, int ranks, size_t files, int64_t totalBytes,
               int64_t largest) {
  std::printf("convert: %s written in %.2f s by %d rank%s (%zu files, %.0f MB/s); peak RSS %s, the largest tensor %s\n",
              output.output().c_str(), seconds, ranks, ranks == 1 ? "" : "s", files,
              static_cast<double>(totalBytes) / 1e6 / std::max(seconds, 1e-9),
              humanBytes(process::peakResidentBytes()).c_str(), humanBytes(largest).c_str());
  std::fflush(stdout);
}

}  // namespace

Status runConvertJob(const RankContext& ctx, const planner::JobSpec& spec, ReportClient& reports) {
  const planner::ConvertSpec& c = spec.convert;
  const auto started = std::chrono::steady_clock::now();
  // A conversion to loom needs the training state too (optimizer moments, progress).
  std::unique_ptr<convert::CheckpointSource> opened;
  const convert::ResumableCheckpoint* resumable = nullptr;
  if (c.to == "loom") {
    auto r = convert::openResumable(c.from, c.modelConfig);
    if (!r.isOk()) return r.status().withContext("convert.from");
    resumable = r->get();
    opened = std::move(*r);
  } else {
    auto r = convert::openCheckpoint(c.from);
    if (!r.isOk()) return r.status().withContext("convert.from");
    opened = std::move(*r);
  }
  const convert::CheckpointSource& source = *opened;

  int64_t totalBytes = 0, largest = 0, share = 0;
  size_t files = 0;
  std::unique_ptr<HfWriter> hf;
  std::unique_ptr<LoomWriter> loom;
  std::string what;
  if (c.to == "loom") {
    ASSIGN_OR_RETURN(convert::LayoutPlan target, targetLayout(*resumable, c.layout));
    const planner::PlanMesh m = target.plan.mesh;
    what = fmt::format("a Loom checkpoint for ZeRO stage {} over {} ranks (data parallel {} x sequence parallel {} x "
                       "tensor parallel {})",
                       target.deepspeed.zero.stage, m.world, m.dp, m.sp, m.tp);
    loom = std::make_unique<LoomWriter>(*resumable, std::move(target));
    RETURN_IF_ERROR(loom->prepare().withContext("convert.layout"));
    totalBytes = loom->totalBytes();
    largest = loom->largestTensorBytes();
    share = loom->shareBytes(ctx.rank, ctx.worldSize);
    files = loom->fileCount();
  } else {
    hf = std::make_unique<HfWriter>(source, c);
    RETURN_IF_ERROR(hf->check());
    what = fmt::format("{} tensors, {}{}", source.tensors().size(), humanBytes(hf->totalBytes()),
                       source.tiedCount() ? fmt::format(", {} tied (stored once)", source.tiedCount()) : "");
    totalBytes = hf->totalBytes();
    largest = hf->largestTensorBytes();
    share = hf->shareBytes(ctx.rank, ctx.worldSize);
    files = hf->fileCount();
  }
  if (ctx.rank == 0) std::printf("convert: %s: %s\n", source.describe().c_str(), what.c_str());
  std::fflush(stdout);

  ASSIGN_OR_RETURN(auto output, ConvertOutput::begin(ctx, spec));
  ConvertProgress progress(reports, share);
  if (loom) {
    RETURN_IF_ERROR(loom->writeShare(output->dir(), ctx.rank, ctx.worldSize, progress));
    RETURN_IF_ERROR(output->finish([&](const std::string& dir) { return loom->complete(dir); }));
  } else {
    RETURN_IF_ERROR(hf->writeShare(output->dir(), ctx.rank, ctx.worldSize, progress));
    RETURN_IF_ERROR(output->finish([&](const std::string& dir) { return hf->complete(dir); }));
  }
  progress.finished();
  if (ctx.rank == 0) {
    printDone(*output, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), ctx.worldSize,
              files, totalBytes, largest);
    if (loom)
      std::printf("convert: a train job of that layout resumes from it with train.checkpoint_dir %s\n",
                  output->output().c_str());
    std::fflush(stdout);
  }
  return Status::ok();
}

}  // namespace loom::worker
