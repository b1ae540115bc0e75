#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/convert/checkpoint_source.h"
#include "worker/convert/deepspeed_checkpoint.h"

namespace loom::convert {

// A DeepSpeed 0.19.8 ZeRO checkpoint read as a training checkpoint that a Loom job resumes from:
// the fp32 masters and the optimizer's moments of every trained parameter, laid out as
// DeepSpeedCheckpoint finds them, and where training stood (global_steps, skipped_steps,
// global_samples, the ds_config it ran with, read as Loom reads a job's `deepspeed`). DeepSpeed
// does not keep the model's config.json: `configPath` names it (convert.config), which may be
// empty when `needModel` is false (model() and modelConfigText() are then empty).
//
// Frozen parameters become train.frozen_parameters of their exact names (escaped), which the
// resuming job lists the same. Refused, naming what: an fp16 checkpoint (its dynamic loss scale is
// not carried over) and a ds_config Loom does not run.
class DeepSpeedResumable : public ResumableCheckpoint {
 public:
  static StatusOr<std::unique_ptr<DeepSpeedResumable>> open(std::unique_ptr<DeepSpeedCheckpoint> checkpoint,
                                                            const std::string& configPath, bool needModel);

  std::string describe() const override { return checkpoint_->describe(); }
  const std::vector<SourceTensor>& tensors() const override { return checkpoint_->tensors(); }
  size_t tiedCount() const override { return checkpoint_->tiedCount(); }
  Status read(const SourceRange& range, const std::string& name, void* out) const override {
    return checkpoint_->read(range, name, out);
  }

  const std::vector<SourceRange>* state(const std::string& name, const std::string& state) const override;
  int64_t optimizerSteps() const override { return checkpoint_->globalSteps() - checkpoint_->skippedSteps(); }
  const nlohmann::json& trainerState() const override { return trainer_; }
  const std::string& tag() const override { return tag_; }
  const std::string& modelConfigText() const override { return configText_; }
  const planner::ModelConfig& model() const override { return model_; }
  const std::vector<std::string>& frozen() const override { return frozen_; }
  const std::string& tagDir() const override { return checkpoint_->tagDir(); }
  const std::vector<std::string>& modelFiles() const override { return noFiles_; }

 private:
  DeepSpeedResumable() = default;

  std::unique_ptr<DeepSpeedCheckpoint> checkpoint_;
  std::map<std::string, const SourceTensor*> masters_;
  nlohmann::json trainer_;
  std::string tag_, configText_;
  planner::ModelConfig model_;
  std::vector<std::string> frozen_, noFiles_;
};

}  // namespace loom::convert
