#include "worker/torch/checkpoint/checkpoint.h"

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"
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
  Status written = saveSafetensorsFile(tmp + "/" + checkpoint::rankFileName(rank), contents.rank);
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
  if (!files::exists(dir + "/latest")) return std::optional<CheckpointContents>();
  ASSIGN_OR_RETURN(std::string tag, checkpoint::readLatestTag(dir));
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
  return std::optional<CheckpointContents>(std::move(contents));
}

}  // namespace loom::worker
