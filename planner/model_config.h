#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace loom::planner {

enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3, kMixtral, kQwen2Moe, kQwen3Moe };
const char* modelFamilyName(ModelFamily family);

// Rotary position embedding: HF's rope_parameters (transformers 5) or rope_theta + rope_scaling
// (transformers 4). Types default, linear and llama3; others are refused by name.
struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3 };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  double lowFreqFactor = 1.0;            // llama3
  double highFreqFactor = 4.0;           // llama3
  int64_t originalMaxPositions = 8192;   // llama3: original_max_position_embeddings
};

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

  // Numerics: what the worker needs to compute what HF computes (the planner ignores them).
  double rmsNormEps = 1e-6;
  double initializerRange = 0.02;
  int64_t maxPositionEmbeddings = 2048;
  RopeConfig rope;
  int64_t slidingWindow = 0;  // attention looks back at most this many tokens; 0: unlimited (mistral)
};

// Parses `config.json`; errors name the field (and `source`, the file, when given). An unknown
// model_type is refused with the supported ones named.
StatusOr<ModelConfig> parseModelConfig(const std::string& json, const std::string& source = "config.json");

}  // namespace loom::planner
