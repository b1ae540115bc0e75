#include "worker/torch/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"

namespace loom::worker {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

StatusOr<uint32_t> crc32Of(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return notFound("{}: cannot open", path);
  std::vector<unsigned char> buffer(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  ssize_t n;
  while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) crc = crc32(crc, buffer.data(), static_cast<uInt>(n));
  ::close(fd);
  if (n < 0) return internalError("{}: read failed", path);
  return static_cast<uint32_t>(crc);
}

Status barrier(backends::Communicator* comm, const char* what) {
  if (!comm) return Status::ok();
  return comm->barrier()->wait().withContext(what);
}

std::string rankFile(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

// Rank 0's part: the manifest over every file, the rename, then `latest`.
Status publish(const std::string& dir, const std::string& tmp, const std::string& tag) {
  json manifest{{"tag", tag}, {"files", json::object()}};
  for (const auto& entry : fs::directory_iterator(tmp)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    ASSIGN_OR_RETURN(uint32_t crc, crc32Of(entry.path().string()));
    manifest["files"][name] = {{"bytes", entry.file_size()}, {"crc32", crc}};
  }
  RETURN_IF_ERROR(files::writeFileAtomic(tmp + "/manifest.json", manifest.dump(2)));
  const std::string final = dir + "/" + tag;
  // A checkpoint of the same step from an attempt that died after renaming is replaced whole.
  if (files::exists(final)) RETURN_IF_ERROR(files::removeAll(final));
  std::error_code ec;
  fs::rename(tmp, final, ec);
  if (ec) return internalError("checkpoint: cannot rename {} to {}: {}", tmp, final, ec.message());
  RETURN_IF_ERROR(files::syncDirectory(dir));
  return files::writeFileAtomic(dir + "/latest", tag + "\n");
}

}  // namespace

std::string checkpointTag(int64_t step) { return fmt::format("global_step{}", step); }

Status saveCheckpoint(const std::string& dir, int64_t step, const CheckpointContents& contents,
                      const WeightStream& weights, int rank, backends::Communicator* comm) {
  const std::string tag = checkpointTag(step);
  const std::string tmp = dir + "/." + tag + ".tmp";
  if (rank == 0) {
    RETURN_IF_ERROR(files::makeDirs(dir));
    if (files::exists(tmp)) RETURN_IF_ERROR(files::removeAll(tmp));
    RETURN_IF_ERROR(files::makeDirs(tmp));
  }
  RETURN_IF_ERROR(barrier(comm, "checkpoint: waiting for the directory"));
  Status written = saveSafetensorsFile(tmp + "/" + rankFile(rank), contents.rank);
  // Every rank takes part in gathering the weights, tensor by tensor, even after its own write
  // failed: the others would wait for it in the gathers. Rank 0 writes them.
  Status streamed = streamSafetensorsModel(tmp, weights.entries, weights.produce, /*write=*/rank == 0).status();
  if (written.isOk()) written = streamed;
  if (written.isOk() && rank == 0) {
    written = saveSafetensorsFile(tmp + "/optimizer.safetensors", contents.optimizer);
    if (written.isOk()) written = files::writeFileAtomic(tmp + "/config.json", contents.modelConfig);
    if (written.isOk()) written = files::writeFileAtomic(tmp + "/trainer_state.json", contents.trainer.dump(2));
  }
  // A rank that failed to write still joins the barrier, so the others do not hang; the
  // checkpoint is then never published and the attempt fails with this rank's error.
  RETURN_IF_ERROR(barrier(comm, "checkpoint: waiting for every rank's files"));
  if (!written.isOk()) return written.withContext(fmt::format("checkpoint {}", tag));
  if (rank == 0) RETURN_IF_ERROR(publish(dir, tmp, tag));
  return barrier(comm, "checkpoint: waiting for it to be published");
}

StatusOr<std::optional<CheckpointContents>> loadLatestCheckpoint(const std::string& dir, int rank) {
  const std::string latest = dir + "/latest";
  if (!files::exists(latest)) return std::optional<CheckpointContents>();
  ASSIGN_OR_RETURN(std::string tag, files::readFile(latest));
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
  const std::string path = dir + "/" + tag;
  ASSIGN_OR_RETURN(std::string manifestText, files::readFile(path + "/manifest.json"));
  json manifest = json::parse(manifestText, nullptr, false);
  if (!manifest.is_object() || !manifest.contains("files"))
    return Status(StatusCode::kDataLoss, fmt::format("{}/manifest.json: not a checkpoint manifest", path));
  for (auto it = manifest["files"].begin(); it != manifest["files"].end(); ++it) {
    const std::string file = path + "/" + it.key();
    std::error_code ec;
    const auto bytes = fs::file_size(file, ec);
    if (ec) return Status(StatusCode::kDataLoss, fmt::format("{}: listed in the manifest but missing", file));
    if (bytes != it.value()["bytes"].get<uint64_t>())
      return Status(StatusCode::kDataLoss, fmt::format("{}: {} bytes, the manifest says {}", file, bytes,
                                                       it.value()["bytes"].get<uint64_t>()));
    ASSIGN_OR_RETURN(uint32_t crc, crc32Of(file));
    if (crc != it.value()["crc32"].get<uint32_t>())
      return Status(StatusCode::kDataLoss, fmt::format("{}: CRC-32 does not match the manifest: the file is corrupt", file));
  }
  CheckpointContents contents;
  ASSIGN_OR_RETURN(contents.model, loadSafetensors(path));
  ASSIGN_OR_RETURN(contents.optimizer, loadSafetensors(path + "/optimizer.safetensors"));
  ASSIGN_OR_RETURN(contents.modelConfig, files::readFile(path + "/config.json"));
  ASSIGN_OR_RETURN(std::string trainer, files::readFile(path + "/trainer_state.json"));
  contents.trainer = json::parse(trainer, nullptr, false);
  if (!contents.trainer.is_object())
    return Status(StatusCode::kDataLoss, fmt::format("{}/trainer_state.json: not a JSON object", path));
  contents.trainer["tag"] = tag;
  if (files::exists(path + "/" + rankFile(rank))) {
    ASSIGN_OR_RETURN(contents.rank, loadSafetensors(path + "/" + rankFile(rank)));
  }
  return std::optional<CheckpointContents>(std::move(contents));
}

}  // namespace loom::worker
