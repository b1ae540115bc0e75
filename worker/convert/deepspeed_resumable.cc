#include "worker/convert/deepspeed_resumable.h"

#include <filesystem>
#include <string_view>

#include <fmt/format.h>

#include "common/files.h"
#include "planner/deepspeed_config.h"
#include "worker/optim/loss_scaler.h"

namespace loom::convert {

namespace {

// A regular expression (ECMAScript, as train.frozen_parameters reads them) matching `name` alone.
std::string exactPattern(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<DeepSpeedResumable>> DeepSpeedResumable::open(std::unique_ptr<DeepSpeedCheckpoint> checkpoint,
                                                                       const std::string& configPath,
                                                                       bool needModel) {
  std::unique_ptr<DeepSpeedResumable> out(new DeepSpeedResumable());
  const DeepSpeedCheckpoint& ds = *checkpoint;
  if (configPath.empty() && needModel)
    return invalidArgument("convert.config: {} is a DeepSpeed checkpoint, which does not keep the model's "
                           "config.json: name it (the HF model directory's config.json) to convert to loom",
                           ds.tagDir());
  if (!configPath.empty()) {
    ASSIGN_OR_RETURN(out->configText_, files::readFile(configPath));
    auto model = planner::parseModelConfig(out->configText_, configPath);
    if (!model.isOk()) return model.status().withContext("convert.config");
    out->model_ = *model;
  }
  if (!ds.config().is_object())
    return invalidArgument("{}: the model states keep no ds_config: the settings it trained with are unknown", ds.tagDir());
  auto config = planner::parseDeepSpeedConfig(ds.config(), ds.worldSize(), /*training=*/true);
  if (!config.isOk()) return config.status().withContext(ds.tagDir() + ": ds_config");
  if (config->precision == planner::Precision::kFp16)
    return invalidArgument("{}: an fp16 checkpoint: its dynamic loss scale is not carried over by a conversion "
                           "to loom or deepspeed_universal in this version (fp32 and bf16 are)",
                           ds.tagDir());
  for (const SourceTensor& t : ds.tensors()) {
    // A frozen parameter becomes train.frozen_parameters' pattern of exactly its name.
    if (t.role == SourceTensor::Role::kFrozen) out->frozen_.push_back(exactPattern(t.name));
    if (t.role == SourceTensor::Role::kTrainable) out->masters_[t.name] = &t;
  }
  out->tag_ = std::filesystem::path(ds.tagDir()).lexically_normal().filename().string();
  const train::LossScaler scaler(*config);
  out->trainer_ = {{"step", ds.globalSteps()},
                   {"applied_steps", ds.globalSteps() - ds.skippedSteps()},
                   {"skipped_steps", ds.skippedSteps()},
                   {"consumed_samples", ds.globalSamples()},
                   {"train_batch_size", config->trainBatchSize},
                   {"dp_world_size", ds.worldSize()},
                   {"tensor_parallel", 1},
                   {"sequence_parallel", 1},
                   {"zero_stage", ds.zeroStage()},
                   {"frozen_parameters", out->frozen_},
                   {"loss_scaler", scaler.state()},
                   {"deepspeed", config->toJson()}};
  out->checkpoint_ = std::move(checkpoint);
  return out;
}

const std::vector<SourceRange>* DeepSpeedResumable::state(const std::string& name, const std::string& state) const {
  if (state != "master") return checkpoint_->moment(name, state);
  auto it = masters_.find(name);
  return it == masters_.end() ? nullptr : &it->second->ranges;
}

}  // namespace loom::convert
