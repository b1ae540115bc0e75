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
  // false for a persistent buffer: saved in the checkpoint beside the parameters but never given
  // a gradient (deepseek_v3's mlp.gate.e_score_correction_bias, which HF keeps in fp32 and the
  // load-balancing rule updates).
  bool trainable = true;
  int layer = -1;              // the decoder layer it belongs to; -1 for the embedding, final norm and head
  int64_t numel() const;
};

// Every tensor of the model's checkpoint, in HF's order (embedding, layers, final norm, head),
// named and shaped as HF's safetensors files hold them: experts one by one (transformers 5 fuses
// them in memory). Tied embeddings have no lm_head.weight (it is the embedding). The one place
// that knows a model family's parameters: the planner lays them out, the worker checks its model
// against them. DeepSeek's multi-token-prediction layers are not part of HF's model, so not here.
std::vector<ParameterInfo> enumerateParameters(const ModelConfig& config);
// Elements of all of them, buffers included (as the published sizes of checkpoints count).
int64_t countParameters(const std::vector<ParameterInfo>& parameters);

}  // namespace loom::planner
