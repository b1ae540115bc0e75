#include "worker/convert/convert_job.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "backends/rendezvous/tcp_store.h"
#include "common/files.h"
#include "common/human_bytes.h"
#include "common/process.h"
#include "worker/checkpoint/safetensors_writer.h"
#include "worker/convert/deepspeed_checkpoint.h"
#include "worker/convert/dtype_cast.h"

namespace loom::worker {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kChunkBytes = int64_t(64) << 20;

Status checkOutput(const std::string& output) {
  std::error_code ec;
  if (!fs::exists(output, ec)) return Status::ok();
  if (!fs::is_directory(output, ec) || !fs::is_empty(output, ec))
    return failedPrecondition("convert.output: {} exists and is not an empty directory: nothing is written over",
                              output);
  return Status::ok();
}

}  // namespace

Status runConvertJob(const RankContext& ctx, const planner::JobSpec& spec, ReportClient& reports) {
  const planner::ConvertSpec& c = spec.convert;
  const auto started = std::chrono::steady_clock::now();
  if (ctx.rank == 0) RETURN_IF_ERROR(checkOutput(c.output));
  auto opened = convert::DeepSpeedCheckpoint::open(c.from);
  if (!opened.isOk()) return opened.status().withContext("convert.from");
  const convert::DeepSpeedCheckpoint& source = *opened;
  const auto& tensors = source.tensors();

  std::vector<checkpoint::SafetensorsEntry> entries;
  std::vector<std::string> storedAs;  // safetensors' name of each tensor's stored dtype
  int64_t totalBytes = 0, largest = 0;
  for (const auto& t : tensors) {
    const convert::StoredDtype* d = convert::storedDtype(t.dtype);
    if (!d) return invalidArgument("convert.from: tensor {} is {}, which safetensors does not hold", t.name, t.dtype);
    storedAs.push_back(d->safetensors);
    entries.push_back({t.name, convert::outputDtype(*d, c.dtype), t.shape});
    totalBytes += t.bytes();
    largest = std::max(largest, t.bytes());
  }
  if (ctx.rank == 0)
    std::printf("convert: %s, DeepSpeed %s, ZeRO stage %d over %d ranks: %zu tensors, %s%s\n", source.tagDir().c_str(),
              source.deepspeedVersion().empty() ? "?" : source.deepspeedVersion().c_str(), source.zeroStage(),
              source.worldSize(), tensors.size(), humanBytes(totalBytes).c_str(),
              source.aliases().empty() ? "" : fmt::format(", {} tied (stored once)", source.aliases().size()).c_str());
  std::fflush(stdout);

  // Written beside the output and renamed into place when whole; a restarted attempt starts over.
  const fs::path output = fs::path(c.output).lexically_normal();
  const fs::path parent = output.has_parent_path() ? output.parent_path() : fs::path(".");
  const std::string tmp = (parent / ("." + output.filename().string() + ".convert-" + ctx.jobId)).string();
  // Several ranks split the shards (shard s is rank s % ranks'); rank 0 makes the directory,
  // waits for the others' shards, writes the index and publishes. They meet in the attempt's store.
  std::unique_ptr<backends::TcpStore> store;
  const auto wait = std::chrono::milliseconds(spec.collectiveTimeoutMs);
  if (ctx.worldSize > 1) {
    auto connected = backends::TcpStore::connect({.host = ctx.masterAddr,
                                                  .port = ctx.masterPort,
                                                  .isServer = ctx.rank == 0,
                                                  .connectTimeout = std::chrono::milliseconds(spec.rendezvousTimeoutMs)});
    if (!connected.isOk()) return connected.status().withContext("rendezvous");
    store = std::move(*connected);
  }
  if (ctx.rank == 0) {
    RETURN_IF_ERROR(files::removeAll(tmp));
    RETURN_IF_ERROR(files::makeDirs(tmp));
    if (store) RETURN_IF_ERROR(store->set("convert/ready", "1"));
  } else {
    RETURN_IF_ERROR(store->get({"convert/ready"}, wait).status().withContext("waiting for rank 0's directory"));
  }

  const checkpoint::ShardPlan plan = checkpoint::planShards(entries, c.shardBytes);
  int64_t myBytes = 0;
  for (size_t s = ctx.rank; s < plan.shards.size(); s += ctx.worldSize)
    for (size_t i : plan.shards[s]) myBytes += tensors[i].bytes();
  int64_t bytesDone = 0, tensorsDone = 0;
  std::vector<char> in, out;
  auto report = [&](double fraction) {
    reports.progress(tensorsDone, {{"tensors_done", static_cast<double>(tensorsDone)},
                                   {"bytes_done", static_cast<double>(bytesDone)},
                                   {"progress", fraction},
                                   {"memory.peak_rss_bytes", static_cast<double>(process::peakResidentBytes())}});
  };
  const checkpoint::BytesProducer produce = [&](size_t i, const checkpoint::ByteSink& sink) -> Status {
    const convert::SourceTensor& t = tensors[i];
    const std::string& from = storedAs[i];
    const std::string& to = entries[i].dtype;
    const int64_t inElement = t.elementBytes, outElement = checkpoint::safetensorsElementBytes(to);
    // Whole elements per chunk, from each of the tensor's ranges in turn.
    const int64_t perChunk = std::max<int64_t>(1, kChunkBytes / std::max(inElement, outElement));
    for (const convert::SourceRange& range : t.ranges) {
      for (int64_t done = 0; done < range.bytes;) {
        const int64_t bytes = std::min(range.bytes - done, perChunk * inElement);
        in.resize(static_cast<size_t>(bytes));
        convert::SourceRange piece = range;
        piece.offset += done;
        piece.bytes = bytes;
        RETURN_IF_ERROR(source.read(piece, t.name, in.data()));
        if (from == to) {
          RETURN_IF_ERROR(sink(in.data(), in.size()));
        } else {
          const int64_t count = bytes / inElement;
          out.resize(static_cast<size_t>(count * outElement));
          convert::castFloats(from, to, in.data(), out.data(), count);
          RETURN_IF_ERROR(sink(out.data(), out.size()));
        }
        done += bytes;
      }
    }
    bytesDone += t.bytes();
    ++tensorsDone;
    report(myBytes ? static_cast<double>(bytesDone) / static_cast<double>(myBytes) : 1.0);
    return Status::ok();
  };
  for (size_t s = ctx.rank; s < plan.shards.size(); s += ctx.worldSize)
    RETURN_IF_ERROR(checkpoint::writeShard(tmp, plan, s, entries, produce).withContext("convert.output"));

  if (ctx.rank != 0) {
    RETURN_IF_ERROR(store->set(fmt::format("convert/done/{}", ctx.rank), "1"));
    // The job succeeds once the output is published; rank 0 serves the store until every rank
    // has seen it.
    RETURN_IF_ERROR(store->get({"convert/published"}, wait).status().withContext("waiting for rank 0 to publish"));
    RETURN_IF_ERROR(store->set(fmt::format("convert/seen/{}", ctx.rank), "1"));
    report(1.0);
    return Status::ok();
  }
  std::vector<std::string> others;
  for (int r = 1; r < ctx.worldSize; ++r) others.push_back(fmt::format("convert/done/{}", r));
  if (!others.empty())
    RETURN_IF_ERROR(store->get(others, wait).status().withContext("waiting for the other ranks' shards"));
  RETURN_IF_ERROR(checkpoint::writeShardIndex(tmp, plan, entries).withContext("convert.output"));
  RETURN_IF_ERROR(files::syncDirectory(tmp));
  std::error_code ec;
  if (fs::exists(output, ec)) fs::remove(output, ec);  // the empty directory checkOutput allowed
  fs::rename(tmp, output, ec);
  if (ec) return internalError("convert.output: cannot rename {} to {}: {}", tmp, output.string(), ec.message());
  RETURN_IF_ERROR(files::syncDirectory(parent.string()));
  if (store) {
    RETURN_IF_ERROR(store->set("convert/published", "1"));
    std::vector<std::string> seen;
    for (int r = 1; r < ctx.worldSize; ++r) seen.push_back(fmt::format("convert/seen/{}", r));
    RETURN_IF_ERROR(store->get(seen, wait).status().withContext("waiting for the other ranks to finish"));
  }
  report(1.0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const size_t files = plan.files.size() + (plan.files.size() > 1 ? 1 : 0);
  std::printf("convert: %s written in %.2f s by %d rank%s (%zu files, %.0f MB/s); peak RSS %s, the largest tensor %s\n",
              output.c_str(), seconds, ctx.worldSize, ctx.worldSize == 1 ? "" : "s", files,
              static_cast<double>(totalBytes) / 1e6 / std::max(seconds, 1e-9),
              humanBytes(process::peakResidentBytes()).c_str(), humanBytes(largest).c_str());
  std::fflush(stdout);
  return Status::ok();
}

}  // namespace loom::worker
