#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/deepspeed_config.h"

namespace loom::train {

// fp16's loss scale, with DeepSpeed's dynamic rules: on an overflow the step is skipped and,
// once the hysteresis is used up, the scale halves (not below min_loss_scale); after `window`
// steps without an overflow it doubles. A static scale (loss_scale > 0) never moves. Without
// fp16 the scale is 1 and nothing is ever skipped for it.
class LossScaler {
 public:
  explicit LossScaler(const planner::DeepSpeedConfig& config);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // Records one optimizer step's outcome. An overflow at the minimum scale is an error, as in
  // DeepSpeed: training cannot make progress.
  Status update(bool overflow);

  nlohmann::json state() const;
  Status restore(const nlohmann::json& state);

 private:
  planner::LossScaleConfig config_;
  bool dynamic_ = false;
  double scale_ = 1.0;
  int hysteresisLeft_ = 0;
  int64_t iteration_ = 0;
  int64_t lastOverflowIteration_ = -1;
};

}  // namespace loom::train
