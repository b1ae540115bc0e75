#include "worker/torch/jobs/convert_job.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>

#include "common/files.h"
#include "common/human_bytes.h"
#include "worker/convert/deepspeed_checkpoint.h"
#include "worker/torch/checkpoint/safetensors.h"

namespace loom::worker {

namespace {

namespace fs = std::filesystem;

StatusOr<at::ScalarType> scalarTypeOf(const std::string& dtype, const std::string& tensor) {
  static const std::map<std::string, at::ScalarType> kTypes{
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort},  {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  auto it = kTypes.find(dtype);
  if (it == kTypes.end()) return invalidArgument("tensor {}: dtype {} is not one safetensors holds here", tensor, dtype);
  return it->second;
}

// convert.dtype: floating tensors in fp32 or bf16, or each as stored; other tensors as stored.
at::ScalarType outputType(const std::string& dtype, at::ScalarType stored) {
  if (!at::isFloatingType(stored) || dtype == "keep") return stored;
  return dtype == "bf16" ? at::kBFloat16 : at::kFloat;
}

Status syncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return internalError("{}: cannot open to fsync", dir);
  ::fsync(fd);
  ::close(fd);
  return Status::ok();
}

// An output that exists must be an empty directory: a conversion never writes over anything.
Status checkOutput(const std::string& output) {
  std::error_code ec;
  if (!fs::exists(output, ec)) return Status::ok();
  if (!fs::is_directory(output, ec) || !fs::is_empty(output, ec))
    return failedPrecondition("convert.output: {} exists and is not an empty directory: nothing is written over", output);
  return Status::ok();
}

}  // namespace

Status runConvertJob(const RankContext& ctx, const planner::JobSpec& spec, const TorchRuntime::ProgressFn& progress) {
  const planner::ConvertSpec& c = spec.convert;
  const auto started = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(checkOutput(c.output));
  auto opened = convert::DeepSpeedCheckpoint::open(c.from);
  if (!opened.isOk()) return opened.status().withContext("convert.from");
  const convert::DeepSpeedCheckpoint& source = *opened;
  const auto& tensors = source.tensors();

  std::vector<TensorEntry> entries;
  std::vector<at::ScalarType> stored;
  int64_t totalBytes = 0;
  for (const auto& t : tensors) {
    ASSIGN_OR_RETURN(at::ScalarType type, scalarTypeOf(t.dtype, t.name));
    stored.push_back(type);
    entries.push_back({t.name, outputType(c.dtype, type), t.shape});
    totalBytes += t.bytes();
  }
  std::printf("convert: %s, DeepSpeed %s, ZeRO stage %d over %d ranks: %zu tensors, %s%s\n", source.tagDir().c_str(),
              source.deepspeedVersion().empty() ? "?" : source.deepspeedVersion().c_str(), source.zeroStage(),
              source.worldSize(), tensors.size(), humanBytes(totalBytes).c_str(),
              source.aliases().empty() ? "" : fmt::format(", {} tied (stored once)", source.aliases().size()).c_str());
  std::fflush(stdout);

  // Written beside the output, renamed into place when whole; a restarted attempt starts over.
  const fs::path output = fs::path(c.output).lexically_normal();
  const fs::path parent = output.has_parent_path() ? output.parent_path() : fs::path(".");
  const std::string tmp = (parent / ("." + output.filename().string() + ".convert-" + ctx.jobId)).string();
  RETURN_IF_ERROR(files::removeAll(tmp));
  RETURN_IF_ERROR(files::makeDirs(tmp));

  int64_t bytesDone = 0, tensorsDone = 0;
  const TensorProducer produce = [&](size_t i) -> StatusOr<at::Tensor> {
    const convert::SourceTensor& t = tensors[i];
    at::Tensor raw = at::empty({t.numel()}, at::TensorOptions().dtype(stored[i]));
    RETURN_IF_ERROR(source.read(t, raw.data_ptr()));
    at::Tensor out = raw.view(t.shape).to(entries[i].dtype);
    bytesDone += t.bytes();
    ++tensorsDone;
    progress(tensorsDone, {{"tensors_done", static_cast<double>(tensorsDone)},
                           {"bytes_done", static_cast<double>(bytesDone)},
                           {"progress", totalBytes ? static_cast<double>(bytesDone) / totalBytes : 1.0}});
    return out;
  };
  auto written = streamSafetensorsModel(tmp, entries, produce, /*write=*/true, c.shardBytes);
  if (!written.isOk()) return written.status().withContext("convert.output");
  RETURN_IF_ERROR(syncDirectory(tmp));
  std::error_code ec;
  if (fs::exists(output, ec)) fs::remove(output, ec);  // the empty directory checkOutput allowed
  fs::rename(tmp, output, ec);
  if (ec) return internalError("convert.output: cannot rename {} to {}: {}", tmp, output.string(), ec.message());
  RETURN_IF_ERROR(syncDirectory(parent.string()));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("convert: %s written in %.2f s (%zu files, %.0f MB/s)\n", output.c_str(), seconds, written->size(),
              totalBytes / 1e6 / std::max(seconds, 1e-9));
  std::fflush(stdout);
  return Status::ok();
}

}  // namespace loom::worker
