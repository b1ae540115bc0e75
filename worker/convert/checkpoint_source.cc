#include "worker/convert/checkpoint_source.h"

#include "common/files.h"
#include "common/shape.h"
#include "worker/checkpoint/manifest.h"
#include "worker/convert/deepspeed_checkpoint.h"
#include "worker/convert/deepspeed_resumable.h"
#include "worker/convert/loom_checkpoint.h"

namespace loom::convert {

int64_t SourceTensor::numel() const { return numelOf(shape); }

namespace {

// A Loom tag directory has its manifest; a Loom checkpoint directory's `latest` names one.
bool isLoomCheckpoint(const std::string& from) {
  std::string tagDir = from;
  if (files::exists(from + "/latest")) {
    auto tag = checkpoint::readLatestTag(from);
    if (tag.isOk()) tagDir = from + "/" + *tag;
  }
  return files::exists(tagDir + "/manifest.json") && files::exists(tagDir + "/trainer_state.json");
}

Status checkExists(const std::string& from) {
  if (!files::exists(from)) return notFound("{} does not exist", from);
  return Status::ok();
}

}  // namespace

StatusOr<std::unique_ptr<CheckpointSource>> openCheckpoint(const std::string& from) {
  RETURN_IF_ERROR(checkExists(from));
  if (isLoomCheckpoint(from)) {
    ASSIGN_OR_RETURN(auto loom, LoomCheckpoint::open(from));
    return std::unique_ptr<CheckpointSource>(std::move(loom));
  }
  ASSIGN_OR_RETURN(auto deepspeed, DeepSpeedCheckpoint::open(from));
  return std::unique_ptr<CheckpointSource>(std::move(deepspeed));
}

StatusOr<std::unique_ptr<ResumableCheckpoint>> openResumable(const std::string& from, const std::string& modelConfig,
                                                             bool needModel) {
  RETURN_IF_ERROR(checkExists(from));
  if (isLoomCheckpoint(from)) {
    ASSIGN_OR_RETURN(auto loom, LoomCheckpoint::open(from));
    return std::unique_ptr<ResumableCheckpoint>(std::move(loom));
  }
  ASSIGN_OR_RETURN(auto deepspeed, DeepSpeedCheckpoint::open(from));
  ASSIGN_OR_RETURN(auto resumable, DeepSpeedResumable::open(std::move(deepspeed), modelConfig, needModel));
  return std::unique_ptr<ResumableCheckpoint>(std::move(resumable));
}

}  // namespace loom::convert
