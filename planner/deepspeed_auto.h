#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::planner {

// What the job itself decides, for the DeepSpeed config's "auto" values (the HF Trainer
// integration's placeholders).
struct AutoContext {
  bool cuda = false;        // resources.device is cuda
  bool training = false;    // a train job
  int64_t trainSteps = 0;   // train.steps
};

// `deepspeed` with its "auto" values resolved where the job decides them, as the HF Trainer
// integration does from its own arguments:
// - the batch triple: an "auto" one is left out, and DeepSpeed's rule derives it from the others
//   and the data-parallel ranks (all three "auto" stays unresolved for a train job);
// - bf16.enabled / fp16.enabled: bf16 on a cuda job, neither on a cpu one (fp32);
// - gradient_clipping: DeepSpeed's default (1.0, the HF Trainer's max_grad_norm default too);
// - scheduler.params.total_num_steps: train.steps; warmup_max_lr: the optimizer's lr;
// - zero_optimization's kModelSizedZeroKeys stay "auto": the plan sizes them from the model.
// Any other "auto" is InvalidArgument listing every field still to fill, in one message.
// expert_parallel's "auto" values are AutoEP's own (taken from the model), left as they are.
StatusOr<nlohmann::json> resolveAutoValues(const nlohmann::json& deepspeed, const AutoContext& context);

}  // namespace loom::planner
