#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/convert/checkpoint_source.h"
#include "worker/convert/torch_pickle.h"
#include "worker/convert/zip_archive.h"

namespace loom::convert {

struct DeepSpeedOpening;

// A DeepSpeed 0.19.8 ZeRO stage 1, 2 or 3 checkpoint, consolidated as its zero_to_fp32.py does,
// without holding any of it: the fp32 master of every trainable parameter from the ranks' flat
// partitions (stages 1 and 2: each parameter group's partitions end to end, walked in
// param_shapes order with its alignment paddings; stage 3: ceil(numel / world) elements of each
// parameter from every rank in turn), frozen parameters from their fragments (model dtype), and
// the module's buffers as stored. Tied parameters (shared_params) are kept as aliases: HF's
// safetensors hold the tensor once. Only the pickles are read on open; the tensors' bytes are
// read by read(), one tensor at a time.
//
// Errors name the file and what does not fit: a missing `latest` or rank file, files of
// different ZeRO stages or sizes, partitions that do not add up to the parameters' shapes, a
// tensor or storage that is not where the pickle says.
class DeepSpeedCheckpoint : public CheckpointSource {
 public:
  // `dir`: the checkpoint directory (its `latest` names the tag) or a tag directory.
  static StatusOr<std::unique_ptr<DeepSpeedCheckpoint>> open(const std::string& dir);

  const std::string& tagDir() const { return tagDir_; }
  int zeroStage() const { return zeroStage_; }
  int worldSize() const { return worldSize_; }
  const std::string& deepspeedVersion() const { return version_; }
  const std::vector<SourceTensor>& tensors() const override { return tensors_; }
  std::string describe() const override;
  size_t tiedCount() const override { return aliases_.size(); }
  // Tied names: the name not stored -> the stored one (lm_head.weight -> model.embed_tokens.weight).
  const std::map<std::string, std::string>& aliases() const { return aliases_; }

  // The optimizer's fp32 state of trainable parameter `parameter`: `name` is one of momentNames()
  // ("exp_avg", "exp_avg_sq" for Adam), whole, laid out as its master in tensors(); null when absent.
  const std::vector<std::string>& momentNames() const { return momentNames_; }
  const std::vector<SourceRange>* moment(const std::string& parameter, const std::string& name) const;
  // Where training stood (the model states' global_steps, skipped_steps, global_samples) and the
  // DeepSpeed config it ran with (ds_config, as JSON).
  int64_t globalSteps() const { return globalSteps_; }
  int64_t skippedSteps() const { return skippedSteps_; }
  int64_t globalSamples() const { return globalSamples_; }
  const nlohmann::json& config() const { return config_; }

  // The bytes of one range (or a part of one) of tensor `name` into `out`.
  Status read(const SourceRange& range, const std::string& name, void* out) const override;

 private:
  friend struct DeepSpeedOpening;  // open()'s parts (deepspeed_checkpoint.cc)
  DeepSpeedCheckpoint() = default;

  std::string tagDir_, version_;
  int zeroStage_ = 0, worldSize_ = 0;
  std::vector<std::unique_ptr<ZipArchive>> archives_;
  std::vector<SourceTensor> tensors_;
  std::map<std::string, std::string> aliases_;
  std::vector<std::string> momentNames_;
  std::map<std::pair<std::string, std::string>, std::vector<SourceRange>> moments_;
  int64_t globalSteps_ = 0, skippedSteps_ = 0, globalSamples_ = 0;
  nlohmann::json config_;
};

}  // namespace loom::convert
