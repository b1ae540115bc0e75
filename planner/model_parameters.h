#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/model_config.h"

namespace loom::planner {

// One parameter as Hugging Face names and shapes it.
struct ParameterInfo {
  std::string name;            // "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // [out, in] for linear weights, as torch stores them
  int expert = -1;             // the expert it belongs to; -1 for dense parameters
  int64_t numel() const;
};

// Every parameter of the model, in HF's order (embedding, layers, final norm, head). Tied
// embeddings have no lm_head.weight (it is the embedding). The one place that knows a model
// family's parameters: the planner lays them out, the worker checks its model against them.
std::vector<ParameterInfo> enumerateParameters(const ModelConfig& config);
int64_t countParameters(const std::vector<ParameterInfo>& parameters);

}  // namespace loom::planner
