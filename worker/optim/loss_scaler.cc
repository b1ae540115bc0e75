#include "worker/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace loom::train {

LossScaler::LossScaler(const planner::DeepSpeedConfig& config) : config_(config.lossScale) {
  if (config.precision != planner::Precision::kFp16) return;
  dynamic_ = config_.staticScale == 0.0;
  scale_ = dynamic_ ? std::ldexp(1.0, config_.initialScalePower) : config_.staticScale;
  hysteresisLeft_ = config_.hysteresis;
}

Status LossScaler::update(bool overflow) {
  if (!dynamic_) return Status::ok();
  if (overflow) {
    if (config_.hysteresis == 1 || hysteresisLeft_ == 1) {
      if (scale_ <= config_.minScale)
        return failedPrecondition("fp16: gradients overflow at the minimum loss scale {} (min_loss_scale): training "
                                  "cannot continue; try bf16, a lower learning rate, or a lower min_loss_scale",
                                  config_.minScale);
      scale_ = std::max(scale_ / 2.0, config_.minScale);
    } else {
      --hysteresisLeft_;
    }
    lastOverflowIteration_ = iteration_;
  } else {
    if (config_.consecutiveHysteresis) hysteresisLeft_ = config_.hysteresis;
    if ((iteration_ - lastOverflowIteration_) % config_.window == 0) {
      if (!config_.consecutiveHysteresis) hysteresisLeft_ = config_.hysteresis;
      scale_ *= 2.0;
    }
  }
  ++iteration_;
  return Status::ok();
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_},
          {"hysteresis_left", hysteresisLeft_},
          {"iteration", iteration_},
          {"last_overflow_iteration", lastOverflowIteration_}};
}

Status LossScaler::restore(const nlohmann::json& state) {
  try {
    scale_ = state.at("scale").get<double>();
    hysteresisLeft_ = state.at("hysteresis_left").get<int>();
    iteration_ = state.at("iteration").get<int64_t>();
    lastOverflowIteration_ = state.at("last_overflow_iteration").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return invalidArgument("loss scaler state: {}", e.what());
  }
  return Status::ok();
}

}  // namespace loom::train
