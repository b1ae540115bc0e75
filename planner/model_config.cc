#include "planner/model_config.h"

#include <nlohmann/json.hpp>

namespace loom::planner {

using nlohmann::json;

const char* modelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kMistral: return "mistral";
    case ModelFamily::kQwen2: return "qwen2";
    case ModelFamily::kQwen3: return "qwen3";
    case ModelFamily::kMixtral: return "mixtral";
    case ModelFamily::kQwen2Moe: return "qwen2_moe";
    case ModelFamily::kQwen3Moe: return "qwen3_moe";
  }
  return "?";
}

StatusOr<ModelConfig> parseModelConfig(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return invalidArgument("{}: not valid JSON: {}", source, e.what());
  }
  if (!j.is_object()) return invalidArgument("{}: must be a JSON object", source);

  auto integer = [&](const char* key, int64_t* out, bool required, int64_t min) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      return required ? invalidArgument("{}: {}: required field is missing", source, key) : Status::ok();
    }
    if (!it->is_number_integer()) return invalidArgument("{}: {}: must be an integer, got {}", source, key, it->type_name());
    *out = it->get<int64_t>();
    if (*out < min) return invalidArgument("{}: {}: must be at least {}, got {}", source, key, min, *out);
    return Status::ok();
  };
  auto boolean = [&](const char* key, bool* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::ok();
    if (!it->is_boolean()) return invalidArgument("{}: {}: must be true or false, got {}", source, key, it->type_name());
    *out = it->get<bool>();
    return Status::ok();
  };

  ModelConfig c;
  auto type = j.find("model_type");
  if (type == j.end() || !type->is_string()) return invalidArgument("{}: model_type: required string is missing", source);
  const std::string modelType = type->get<std::string>();
  if (modelType == "llama") {
    c.family = ModelFamily::kLlama;
  } else if (modelType == "mistral") {
    c.family = ModelFamily::kMistral;
  } else if (modelType == "qwen2") {
    c.family = ModelFamily::kQwen2;
  } else if (modelType == "qwen3") {
    c.family = ModelFamily::kQwen3;
  } else if (modelType == "mixtral") {
    c.family = ModelFamily::kMixtral;
  } else if (modelType == "qwen2_moe") {
    c.family = ModelFamily::kQwen2Moe;
  } else if (modelType == "qwen3_moe") {
    c.family = ModelFamily::kQwen3Moe;
  } else {
    return invalidArgument("{}: model_type: \"{}\" is not a model this version builds (supported: llama, mistral, "
                           "qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe)",
                           source, modelType);
  }
  RETURN_IF_ERROR(integer("vocab_size", &c.vocabSize, true, 1));
  RETURN_IF_ERROR(integer("hidden_size", &c.hiddenSize, true, 1));
  RETURN_IF_ERROR(integer("intermediate_size", &c.intermediateSize, true, 1));
  RETURN_IF_ERROR(integer("num_hidden_layers", &c.numLayers, true, 1));
  RETURN_IF_ERROR(integer("num_attention_heads", &c.numHeads, true, 1));
  c.numKvHeads = c.numHeads;
  RETURN_IF_ERROR(integer("num_key_value_heads", &c.numKvHeads, false, 1));
  if (c.numHeads % c.numKvHeads != 0)
    return invalidArgument("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source, c.numHeads,
                           c.numKvHeads);
  c.headDim = c.hiddenSize / c.numHeads;
  RETURN_IF_ERROR(integer("head_dim", &c.headDim, false, 1));
  if (!j.contains("head_dim") && c.hiddenSize % c.numHeads != 0)
    return invalidArgument("{}: hidden_size {} is not a multiple of num_attention_heads {} (and head_dim is not given)",
                           source, c.hiddenSize, c.numHeads);
  RETURN_IF_ERROR(boolean("tie_word_embeddings", &c.tieWordEmbeddings));
  RETURN_IF_ERROR(boolean("attention_bias", &c.attentionBias));
  RETURN_IF_ERROR(boolean("mlp_bias", &c.mlpBias));
  // Qwen2 always has q/k/v biases and no o_proj bias; Qwen3 normalizes q and k per head.
  if (c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen2Moe) c.attentionBias = true;
  if (c.family == ModelFamily::kQwen3 || c.family == ModelFamily::kQwen3Moe) c.qkNorm = true;
  if (c.family == ModelFamily::kMixtral) {
    RETURN_IF_ERROR(integer("num_local_experts", &c.numExperts, true, 1));
    c.expertIntermediateSize = c.intermediateSize;
  } else if (c.family == ModelFamily::kQwen2Moe || c.family == ModelFamily::kQwen3Moe) {
    RETURN_IF_ERROR(integer("num_experts", &c.numExperts, true, 1));
    if (c.family == ModelFamily::kQwen2Moe)
      RETURN_IF_ERROR(integer("shared_expert_intermediate_size", &c.sharedExpertIntermediateSize, true, 1));
    RETURN_IF_ERROR(integer("moe_intermediate_size", &c.expertIntermediateSize, true, 1));
    int64_t sparseStep = 1;
    RETURN_IF_ERROR(integer("decoder_sparse_step", &sparseStep, false, 1));
    auto dense = j.find("mlp_only_layers");
    if (sparseStep != 1 || (dense != j.end() && dense->is_array() && !dense->empty()))
      return invalidArgument("{}: decoder_sparse_step and mlp_only_layers: models mixing dense and expert layers are "
                             "not supported yet",
                             source);
  }
  if (c.isMoe()) {
    RETURN_IF_ERROR(integer("num_experts_per_tok", &c.expertsPerToken, true, 1));
    if (c.expertsPerToken > c.numExperts)
      return invalidArgument("{}: num_experts_per_tok {} is above the {} experts", source, c.expertsPerToken,
                             c.numExperts);
  }
  return c;
}

}  // namespace loom::planner
