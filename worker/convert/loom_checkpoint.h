#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/model_config.h"
#include "worker/checkpoint/safetensors_reader.h"
#include "worker/checkpoint/state_layout.h"
#include "worker/convert/checkpoint_source.h"
#include "worker/convert/layout_plan.h"

namespace loom::convert {

// A Loom training checkpoint (worker/torch/checkpoint/checkpoint.h) opened for conversion: its
// manifest checked (every file's size and CRC-32), its layout compiled again from the settings
// trainer_state.json keeps, and every parameter's fp32 state (masters and optimizer moments)
// mapped from the pieces the layout's files hold to the whole parameter (the state layout,
// checkpoint/state_layout.h), so that any other layout's pieces can be copied out of it. Nothing
// of the tensors is read on open.
//
// Errors name the file and tensor: a state tensor missing, of another dtype or size than the
// layout says, or a parameter whose pieces leave elements uncovered.
class LoomCheckpoint : public CheckpointSource {
 public:
  // `dir`: a checkpoint directory (train.checkpoint_dir, whose `latest` names the tag) or a tag.
  static StatusOr<std::unique_ptr<LoomCheckpoint>> open(const std::string& dir);

  std::string describe() const override;
  // The model: the fp32 masters of what trains, the frozen parameters and buffers as stored.
  const std::vector<SourceTensor>& tensors() const override { return tensors_; }
  Status read(const SourceRange& range, const std::string& name, void* out) const override;

  const std::string& tagDir() const { return tagDir_; }
  const std::string& tag() const { return tag_; }
  const nlohmann::json& trainerState() const { return trainer_; }
  const std::string& modelConfigText() const { return configText_; }
  const planner::ModelConfig& model() const { return model_; }
  const LayoutPlan& layout() const { return layout_; }
  const std::vector<std::string>& frozen() const { return frozen_; }
  // The model's files, relative to the tag directory (model.safetensors, or its shards and index).
  const std::vector<std::string>& modelFiles() const { return modelFiles_; }

  // Parameter `parameter`'s fp32 state `state` ("master" or an optimizer state name), whole, in
  // row-major order; null when the checkpoint has none (the parameter does not train).
  const std::vector<SourceRange>* state(int parameter, const std::string& state) const;
  // The optimizer's step count (the "step" the state files keep), as stored: int64 [1].
  const SourceRange& step() const { return step_; }
  // A tensor of world rank `rank`'s own file (its "rng"): where it lies and what it is; nullopt
  // when absent.
  struct RankTensor {
    SourceRange range;
    checkpoint::SafetensorsEntry entry;
  };
  std::optional<RankTensor> rankTensor(int rank, const std::string& name) const;

 private:
  LoomCheckpoint() = default;
  Status mapState();
  StatusOr<int> openFile(const std::string& name);

  std::string tagDir_, tag_, configText_;
  nlohmann::json trainer_;
  planner::ModelConfig model_;
  LayoutPlan layout_;
  checkpoint::StateLayout stateLayout_;
  std::vector<std::string> frozen_, modelFiles_;
  std::vector<std::unique_ptr<checkpoint::SafetensorsFile>> files_;
  std::map<std::string, int> fileIndex_;
  std::map<std::pair<int, std::string>, std::vector<SourceRange>> states_;
  SourceRange step_;
  std::vector<SourceTensor> tensors_;
};

}  // namespace loom::convert
