#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/job_spec.h"
#include "planner/model_config.h"
#include "planner/plan.h"

namespace loom::convert {

// A training layout as the convert job sees it: the DeepSpeed config a train job of `ranks` ranks
// runs and the Plan the planner compiles for it, from which the checkpoint's state layout follows
// (checkpoint/state_layout.h).
struct LayoutPlan {
  int ranks = 0;
  planner::DeepSpeedConfig deepspeed;
  planner::Plan plan;
};

// The layout of a train job of `ranks` ranks with `deepspeed` (the JSON a checkpoint's
// trainer_state.json keeps) and train.frozen_parameters `frozen`, for `model`. `where` names the
// source of the settings in errors.
StatusOr<LayoutPlan> compileLayout(const planner::ModelConfig& model, const nlohmann::json& deepspeed, int ranks,
                                   const std::vector<std::string>& frozen, const std::string& where);

// `source` (a DeepSpeed config as trainer_state.json keeps it) changed to convert.layout: its ZeRO
// stage, autotp_size, sequence_parallel_size, autoep_size and stage 3 persistence thresholds where given, and the batch triple derived again
// from train_batch_size over the new data-parallel ranks (which the data position depends on,
// so it stays).
nlohmann::json deepspeedForLayout(const nlohmann::json& source, const planner::ConvertLayout& layout);

}  // namespace loom::convert
