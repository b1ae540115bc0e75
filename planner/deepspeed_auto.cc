#include "planner/deepspeed_auto.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "planner/deepspeed_config.h"

namespace loom::planner {
namespace {

using json = nlohmann::json;

bool isAuto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// Every "auto" left under `v`, as deepspeed.<path>. AutoEP's own "auto" values (top_k,
// score_func, routed_scaling_factor, ...) are DeepSpeed's, which it resolves from the model.
void collectAuto(const json& v, const std::string& path, std::vector<std::string>& out) {
  for (const char* sized : kModelSizedZeroKeys)
    if (path == std::string("deepspeed.zero_optimization.") + sized) return;  // the plan sizes it
  if (isAuto(v)) {
    out.push_back(path);
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it)
      if (path != "deepspeed" || it.key() != "expert_parallel") collectAuto(it.value(), path + "." + it.key(), out);
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) collectAuto(v[i], fmt::format("{}[{}]", path, i), out);
  }
}

// object[key] when both exist; null otherwise.
json* member(json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it.value();
}

}  // namespace

StatusOr<json> resolveAutoValues(const json& deepspeed, const AutoContext& context) {
  json out = deepspeed;
  if (!out.is_object()) return out;  // parseDeepSpeedConfig says what is wrong with it
  // The batch triple: DeepSpeed derives a missing one from the others and the ranks.
  const char* kBatch[] = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"};
  int given = 0;
  for (const char* key : kBatch) given += out.contains(key) && !isAuto(out[key]) ? 1 : 0;
  if (given > 0 || !context.training) {  // a job that does not train needs no batch triple
    for (const char* key : kBatch)
      if (out.contains(key) && isAuto(out[key])) out.erase(key);
  }
  // Precision from the device: bf16 where the job runs on GPUs, fp32 on CPU ranks.
  for (const char* section : {"bf16", "bfloat16", "fp16"}) {
    json* enabled = member(out, section) ? member(*member(out, section), "enabled") : nullptr;
    if (enabled && isAuto(*enabled)) *enabled = std::string(section) != "fp16" && context.cuda;
  }
  // Clipping: DeepSpeed's default, which is the HF Trainer's (max_grad_norm 1.0) too.
  if (json* clip = member(out, "gradient_clipping"); clip && isAuto(*clip)) out.erase("gradient_clipping");
  // The schedule's length is the job's; its peak the optimizer's lr.
  json* params = member(out, "scheduler") ? member(*member(out, "scheduler"), "params") : nullptr;
  if (params) {
    json* total = member(*params, "total_num_steps");
    if (total && isAuto(*total) && context.training && context.trainSteps > 0) *total = context.trainSteps;
    json* peak = member(*params, "warmup_max_lr");
    json* optimizerParams = member(out, "optimizer") ? member(*member(out, "optimizer"), "params") : nullptr;
    json* lr = optimizerParams ? member(*optimizerParams, "lr") : nullptr;
    if (peak && isAuto(*peak) && lr && lr->is_number()) *peak = *lr;
  }
  std::vector<std::string> left;
  collectAuto(out, "deepspeed", left);
  if (left.empty()) return out;
  std::string list;
  for (const std::string& path : left) list += (list.empty() ? "" : ", ") + path;
  return invalidArgument("deepspeed: \"auto\" is filled only where the job decides the value (the batch sizes from "
                         "each other and the ranks, bf16/fp16 from resources.device, gradient_clipping as DeepSpeed's "
                         "default, the scheduler's total_num_steps from train.steps and warmup_max_lr from the "
                         "optimizer's lr); give a value for {}",
                         list);
}

}  // namespace loom::planner
