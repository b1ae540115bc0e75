#include "worker/convert/convert_job.h"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "common/human_bytes.h"
#include "common/process.h"
#include "worker/convert/checkpoint_source.h"
#include "worker/convert/output_dir.h"
#include "worker/convert/to_deepspeed_universal.h"
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
  // A conversion to a training checkpoint reads the training state too (optimizer moments,
  // progress); to loom it needs the model, which a DeepSpeed checkpoint learns from convert.config.
  std::unique_ptr<convert::CheckpointSource> source;
  std::unique_ptr<ConvertWriter> writer;
  std::string what;
  if (c.to == "hf") {
    auto r = convert::openCheckpoint(c.from);
    if (!r.isOk()) return r.status().withContext("convert.from");
    source = std::move(*r);
    auto hf = std::make_unique<HfWriter>(*source, c);
    RETURN_IF_ERROR(hf->check());
    what = fmt::format("{} tensors, {}{}", source->tensors().size(), humanBytes(hf->totalBytes()),
                       source->tiedCount() ? fmt::format(", {} tied (stored once)", source->tiedCount()) : "");
    writer = std::move(hf);
  } else {
    auto r = convert::openResumable(c.from, c.modelConfig, /*needModel=*/c.to == "loom");
    if (!r.isOk()) return r.status().withContext("convert.from");
    const convert::ResumableCheckpoint& resumable = **r;
    source = std::move(*r);
    if (c.to == "loom") {
      ASSIGN_OR_RETURN(convert::LayoutPlan target, targetLayout(resumable, c.layout));
      const planner::PlanMesh m = target.plan.mesh;
      what = fmt::format("a Loom checkpoint for ZeRO stage {} over {} ranks (data parallel {} x sequence parallel {} "
                         "x tensor parallel {})",
                         target.deepspeed.zero.stage, m.world, m.dp, m.sp, m.tp);
      auto loom = std::make_unique<LoomWriter>(resumable, std::move(target));
      RETURN_IF_ERROR(loom->prepare().withContext("convert.layout"));
      writer = std::move(loom);
    } else {
      auto universal = std::make_unique<UniversalWriter>(resumable);
      RETURN_IF_ERROR(universal->prepare());
      what = universal->describe();
      writer = std::move(universal);
    }
  }
  if (ctx.rank == 0) std::printf("convert: %s: %s\n", source->describe().c_str(), what.c_str());
  std::fflush(stdout);

  ASSIGN_OR_RETURN(auto output, ConvertOutput::begin(ctx, spec));
  ConvertProgress progress(reports, writer->shareBytes(ctx.rank, ctx.worldSize));
  RETURN_IF_ERROR(writer->writeShare(output->dir(), ctx.rank, ctx.worldSize, progress));
  RETURN_IF_ERROR(output->finish([&](const std::string& dir) { return writer->complete(dir); }));
  progress.finished();
  if (ctx.rank == 0) {
    printDone(*output, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), ctx.worldSize,
              writer->fileCount(), writer->totalBytes(), writer->largestTensorBytes());
    if (c.to == "loom")
      std::printf("convert: a train job of that layout resumes from it with train.checkpoint_dir %s\n",
                  output->output().c_str());
    if (c.to == "deepspeed_universal")
      std::printf("convert: DeepSpeed resumes from it with engine.load_checkpoint(\"%s\") and \"checkpoint\": "
                  "{\"load_universal\": true} in its config\n",
                  output->output().c_str());
    std::fflush(stdout);
  }
  return Status::ok();
}

}  // namespace loom::worker
