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
class LoomCheckpoint : public ResumableCheckpoint {
 public:
  // `dir`: a checkpoint directory (train.checkpoint_dir, whose `latest` names the tag) or a tag.
  static StatusOr<std::unique_ptr<LoomCheckpoint>> open(const std::string& dir);

  std::string describe() const override;
  // The model: the fp32 masters of what trains, the frozen parameters and buffers as stored.
  const std::vector<SourceTensor>& tensors() const override { return tensors_; }
  Status read(const SourceRange& range, const std::string& name, void* out) const override;

  const std::vector<SourceRange>* state(const std::string& name, const std::string& state) const override;
  int64_t optimizerSteps() const override { return steps_; }
  const nlohmann::json& trainerState() const override { return trainer_; }
  const std::string& tag() const override { return tag_; }
  const std::string& modelConfigText() const override { return configText_; }
  const planner::ModelConfig& model() const override { return model_; }
  const std::vector<std::string>& frozen() const override { return frozen_; }
  const std::string& tagDir() const override { return tagDir_; }
  // model.safetensors, or its shards and index.
  const std::vector<std::string>& modelFiles() const override { return modelFiles_; }
  std::optional<RankTensor> rankTensor(int rank, const std::string& name) const override;

  const LayoutPlan& layout() const { return layout_; }

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
  std::map<std::pair<std::string, std::string>, std::vector<SourceRange>> states_;  // (parameter, state)
  int64_t steps_ = 0;
  std::vector<SourceTensor> tensors_;
};

}  // namespace loom::convert
