#include "worker/convert/checkpoint_source.h"

#include "common/files.h"
#include "worker/checkpoint/manifest.h"
#include "worker/convert/deepspeed_checkpoint.h"
#include "worker/convert/loom_checkpoint.h"

namespace loom::convert {

int64_t SourceTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StatusOr<std::unique_ptr<CheckpointSource>> openCheckpoint(const std::string& from) {
  // A Loom tag directory has its manifest; a Loom checkpoint directory's `latest` names one.
  std::string tagDir = from;
  if (files::exists(from + "/latest")) {
    auto tag = checkpoint::readLatestTag(from);
    if (tag.isOk()) tagDir = from + "/" + *tag;
  }
  if (files::exists(tagDir + "/manifest.json") && files::exists(tagDir + "/trainer_state.json")) {
    ASSIGN_OR_RETURN(auto loom, LoomCheckpoint::open(from));
    return std::unique_ptr<CheckpointSource>(std::move(loom));
  }
  ASSIGN_OR_RETURN(auto deepspeed, DeepSpeedCheckpoint::open(from));
  return std::unique_ptr<CheckpointSource>(std::move(deepspeed));
}

}  // namespace loom::convert
