#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace loom::planner {

enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3, kMixtral, kQwen2Moe, kQwen3Moe };
const char* modelFamilyName(ModelFamily family);

// The fields of a Hugging Face decoder `config.json` that decide the parameters, with HF's
// defaults. Llama-family decoders, dense and mixture-of-experts (Mixtral, Qwen2-MoE, Qwen3-MoE).
struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numLayers = 0;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;        // num_key_value_heads, default num_attention_heads
  int64_t headDim = 0;           // head_dim, default hidden_size / num_attention_heads
  bool tieWordEmbeddings = false;
  bool attentionBias = false;    // q/k/v biases (qwen2 always; llama's attention_bias)
  bool qkNorm = false;           // per-head RMSNorm of q and k (qwen3)
  bool mlpBias = false;
  // Mixture of experts: 0 experts for a dense model.
  int64_t numExperts = 0;              // num_local_experts (mixtral), num_experts (qwen3_moe)
  int64_t expertsPerToken = 0;         // num_experts_per_tok
  int64_t expertIntermediateSize = 0;  // moe_intermediate_size (qwen*_moe); intermediate_size for mixtral
  int64_t sharedExpertIntermediateSize = 0;  // shared_expert_intermediate_size (qwen2_moe); 0: none
  bool isMoe() const { return numExperts > 0; }
};

// Parses `config.json`; errors name the field (and `source`, the file, when given). An unknown
// model_type is refused with the supported ones named.
StatusOr<ModelConfig> parseModelConfig(const std::string& json, const std::string& source = "config.json");

}  // namespace loom::planner
