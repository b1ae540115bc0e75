#include "worker/torch/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "common/files.h"
#include "common/human_bytes.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/state_layout.h"

namespace loom::worker {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

Status barrier(backends::Communicator* comm, const char* what) {
  if (!comm) return Status::ok();
  return comm->barrier()->wait().withContext(what);
}

// Rank 0's part: the manifest over every file, the rename, then `latest`.
Status publish(const std::string& dir, const std::string& tmp, const std::string& tag) {
  RETURN_IF_ERROR(checkpoint::writeManifest(tmp, tag));
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

namespace {

int64_t bytesOf(const TensorMap& tensors) {
  int64_t bytes = 0;
  for (const auto& [name, t] : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

// What rank 0 expects the checkpoint to take: the weights, its optimizer file, and its rank file
// once per rank (the ranks' files are alike in size: equal partitions, or RNG state alone).
int64_t bytesNeeded(const CheckpointContents& contents, const WeightStream& weights, int ranks) {
  int64_t bytes = bytesOf(contents.optimizer) + bytesOf(contents.rank) * ranks +
                  static_cast<int64_t>(contents.modelConfig.size());
  for (const TensorEntry& e : weights.entries) {
    int64_t n = static_cast<int64_t>(c10::elementSize(e.dtype));
    for (int64_t d : e.shape) n *= d;
    bytes += n;
  }
  return bytes;
}

Status checkRoom(const std::string& dir, const std::string& tag, int64_t needed) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (ec) return Status::ok();  // unknown: the writes say it if room runs out
  if (static_cast<int64_t>(space.available) >= needed) return Status::ok();
  return Status(StatusCode::kResourceExhausted,
                fmt::format("checkpoint {}: {} has {} free, the checkpoint needs about {}; the previous checkpoint "
                            "stays `latest`",
                            tag, dir, humanBytes(static_cast<int64_t>(space.available)), humanBytes(needed)));
}

// A write that failed for room after checkRoom passed: the disk filled meanwhile, or a quota or a
// file-size limit stopped it.
Status ranOutOfRoom(const std::string& dir, const std::string& tag, const Status& error, int64_t needed) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  const std::string free = ec ? "" : fmt::format(", {} is free now", humanBytes(static_cast<int64_t>(space.available)));
  return Status(StatusCode::kResourceExhausted,
                fmt::format("checkpoint {}: {} ran out of room while it was written ({}); the checkpoint needs about "
                            "{}{}; the previous checkpoint stays `latest`",
                            tag, dir, error.message(), humanBytes(needed), free));
}

// The tags of `dir`'s complete checkpoints (a manifest inside), newest step first.
std::vector<std::string> completeTags(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("global_step", 0) != 0) continue;
    if (!files::exists(entry.path().string() + "/manifest.json")) continue;
    char* end = nullptr;
    const long long step = std::strtoll(name.c_str() + 11, &end, 10);
    if (end && *end == '\0') found.emplace_back(step, name);
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> tags;
  for (auto& [step, name] : found) tags.push_back(std::move(name));
  return tags;
}

// All but the newest `keep` complete checkpoints, and never the one `latest` names.
Status pruneCheckpoints(const std::string& dir, int keep) {
  const auto latest = checkpoint::readLatestTag(dir);
  const std::vector<std::string> tags = completeTags(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < tags.size(); ++i) {
    if (latest.isOk() && tags[i] == *latest) continue;
    RETURN_IF_ERROR(files::removeAll(dir + "/" + tags[i]).withContext("checkpoint: removing an old checkpoint"));
  }
  return Status::ok();
}

}  // namespace

Status saveCheckpoint(const std::string& dir, int64_t step, const CheckpointContents& contents,
                      const WeightStream& weights, int rank, backends::Communicator* comm, int keep) {
  const std::string tag = checkpointTag(step);
  const std::string tmp = dir + "/." + tag + ".tmp";
  Status room = Status::ok();
  if (rank == 0) {
    RETURN_IF_ERROR(files::makeDirs(dir));
    if (files::exists(tmp)) RETURN_IF_ERROR(files::removeAll(tmp));
    RETURN_IF_ERROR(files::makeDirs(tmp));
    room = checkRoom(dir, tag, bytesNeeded(contents, weights, comm ? comm->size() : 1));
  }
  RETURN_IF_ERROR(barrier(comm, "checkpoint: waiting for the directory"));
  Status written = room.isOk() ? saveSafetensorsFile(tmp + "/" + checkpoint::rankFileName(rank), contents.rank) : room;
  // Every rank takes part in gathering the weights, tensor by tensor, even after its own write
  // failed: the others would wait for it in the gathers. Rank 0 writes them.
  Status streamed =
      streamSafetensorsModel(tmp, weights.entries, weights.produce, /*write=*/rank == 0 && written.isOk()).status();
  if (written.isOk()) written = streamed;
  if (written.isOk() && rank == 0) {
    written = saveSafetensorsFile(tmp + "/optimizer.safetensors", contents.optimizer);
    if (written.isOk()) written = files::writeFileAtomic(tmp + "/config.json", contents.modelConfig);
    if (written.isOk()) written = files::writeFileAtomic(tmp + "/trainer_state.json", contents.trainer.dump(2));
  }
  // A rank that failed to write still joins the barrier, so the others do not hang; the
  // checkpoint is then never published and the attempt fails with this rank's error.
  RETURN_IF_ERROR(barrier(comm, "checkpoint: waiting for every rank's files"));
  if (!written.isOk()) {
    if (rank == 0 && files::exists(tmp)) {  // what did fit goes; `latest` stays
      if (Status removed = files::removeAll(tmp); !removed.isOk())
        std::fprintf(stderr, "warning: %s\n", removed.message().c_str());
    }
    if (written.code() != StatusCode::kResourceExhausted) return written.withContext(fmt::format("checkpoint {}", tag));
    if (!room.isOk()) return room;  // refused before anything was written
    return ranOutOfRoom(dir, tag, written, bytesNeeded(contents, weights, comm ? comm->size() : 1));
  }
  if (rank == 0) {
    RETURN_IF_ERROR(publish(dir, tmp, tag));
    // The new checkpoint is published: an old one that cannot be removed is not the job's failure.
    if (Status pruned = pruneCheckpoints(dir, keep); !pruned.isOk())
      std::fprintf(stderr, "warning: %s\n", pruned.message().c_str());
  }
  return barrier(comm, "checkpoint: waiting for it to be published");
}

namespace {

StatusOr<CheckpointContents> loadCheckpoint(const std::string& dir, const std::string& tag, int rank) {
  const std::string path = dir + "/" + tag;
  RETURN_IF_ERROR(checkpoint::checkManifest(path));
  CheckpointContents contents;
  ASSIGN_OR_RETURN(contents.model, loadSafetensors(path));
  ASSIGN_OR_RETURN(contents.optimizer, loadSafetensors(path + "/optimizer.safetensors"));
  ASSIGN_OR_RETURN(contents.modelConfig, files::readFile(path + "/config.json"));
  ASSIGN_OR_RETURN(std::string trainer, files::readFile(path + "/trainer_state.json"));
  contents.trainer = json::parse(trainer, nullptr, false);
  if (!contents.trainer.is_object())
    return Status(StatusCode::kDataLoss, fmt::format("{}/trainer_state.json: not a JSON object", path));
  contents.trainer["tag"] = tag;
  if (files::exists(path + "/" + checkpoint::rankFileName(rank))) {
    ASSIGN_OR_RETURN(contents.rank, loadSafetensors(path + "/" + checkpoint::rankFileName(rank)));
  }
  return contents;
}

}  // namespace

StatusOr<std::optional<LoadedCheckpoint>> loadNewestGoodCheckpoint(const std::string& dir, int rank) {
  if (!files::exists(dir + "/latest")) return std::optional<LoadedCheckpoint>();
  ASSIGN_OR_RETURN(std::string latest, checkpoint::readLatestTag(dir));
  // `latest` and the older complete ones: a newer directory (left by a run that did not resume)
  // is not this run's.
  const auto stepOf = [](const std::string& tag) { return std::strtoll(tag.c_str() + 11, nullptr, 10); };
  std::vector<std::string> candidates{latest};
  for (std::string& tag : completeTags(dir))
    if (tag != latest && stepOf(tag) < stepOf(latest)) candidates.push_back(std::move(tag));
  LoadedCheckpoint loaded;
  for (const std::string& tag : candidates) {
    auto contents = loadCheckpoint(dir, tag, rank);
    if (contents.isOk()) {
      loaded.contents = std::move(*contents);
      return std::optional<LoadedCheckpoint>(std::move(loaded));
    }
    // Damage (a corrupt, truncated or missing file, a bad manifest) falls back to an older one;
    // anything else (this machine cannot read the directory at all) is the job's error.
    if (contents.status().code() != StatusCode::kDataLoss && contents.status().code() != StatusCode::kNotFound)
      return contents.status();
    loaded.refused.push_back(fmt::format("{}/{}: {}", dir, tag, contents.status().message()));
  }
  std::string reasons;
  for (const std::string& r : loaded.refused) reasons += "; " + r;
  return Status(StatusCode::kDataLoss,
                fmt::format("{}: no checkpoint is whole ({} tried){}", dir, candidates.size(), reasons));
}

}  // namespace loom::worker
