#include "planner/model_config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace loom::planner {

using nlohmann::json;

const char* expertActivationName(ExpertMlpConfig::Activation activation) {
  switch (activation) {
    case ExpertMlpConfig::Activation::kSwiglu: return "swiglu";
    case ExpertMlpConfig::Activation::kGegluTanh: return "geglu_tanh";
    case ExpertMlpConfig::Activation::kSwigluClamped: return "swiglu_clamped";
    case ExpertMlpConfig::Activation::kSwigluOai: return "swiglu_oai";
  }
  return "swiglu";
}

bool parseExpertActivation(const std::string& name, ExpertMlpConfig::Activation* out) {
  for (auto a : {ExpertMlpConfig::Activation::kSwiglu, ExpertMlpConfig::Activation::kGegluTanh,
                 ExpertMlpConfig::Activation::kSwigluClamped, ExpertMlpConfig::Activation::kSwigluOai}) {
    if (name == expertActivationName(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

const char* modelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kMistral: return "mistral";
    case ModelFamily::kQwen2: return "qwen2";
    case ModelFamily::kQwen3: return "qwen3";
    case ModelFamily::kMixtral: return "mixtral";
    case ModelFamily::kQwen2Moe: return "qwen2_moe";
    case ModelFamily::kQwen3Moe: return "qwen3_moe";
    case ModelFamily::kDeepseekV3: return "deepseek_v3";
  }
  return "?";
}

bool ModelConfig::isMoeLayer(int64_t layer) const {
  if (!isMoe() || layer < firstDenseLayers || (layer + 1) % sparseStep != 0) return false;
  return std::find(mlpOnlyLayers.begin(), mlpOnlyLayers.end(), layer) == mlpOnlyLayers.end();
}

int64_t ModelConfig::numMoeLayers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < numLayers; ++l) n += isMoeLayer(l) ? 1 : 0;
  return n;
}

namespace {

StatusOr<double> number(const json& object, const char* key, double fallback, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number()) return invalidArgument("{}: {}: must be a number, got {}", where, key, it->type_name());
  return it->get<double>();
}

// An integer field; a missing or null one leaves `out` as it is unless `required`.
Status readInteger(const json& j, const std::string& source, const char* key, int64_t* out, bool required,
                   int64_t min) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? invalidArgument("{}: {}: required field is missing", source, key) : Status::ok();
  }
  if (!it->is_number_integer())
    return invalidArgument("{}: {}: must be an integer, got {}", source, key, it->type_name());
  *out = it->get<int64_t>();
  if (*out < min) return invalidArgument("{}: {}: must be at least {}, got {}", source, key, min, *out);
  return Status::ok();
}

Status readBoolean(const json& j, const std::string& source, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) return invalidArgument("{}: {}: must be true or false, got {}", source, key, it->type_name());
  *out = it->get<bool>();
  return Status::ok();
}

// A string field that, when given, must be `expected`: a choice HF's model for this family hard-codes.
Status requireStringIfGiven(const json& j, const std::string& source, const char* key, const char* expected,
                            const char* why) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_string() || it->get<std::string>() != expected)
    return invalidArgument("{}: {}: {} is not supported ({})", source, key, it->dump(), why);
  return Status::ok();
}

Status parseYarn(const json& params, const std::string& where, RopeConfig* rope) {
  rope->type = RopeConfig::Type::kYarn;
  for (const char* key : {"factor", "original_max_position_embeddings"}) {
    if (auto it = params.find(key); it == params.end() || it->is_null())
      return invalidArgument("{}: {}: required for rope_type yarn", where, key);
  }
  ASSIGN_OR_RETURN(double original, number(params, "original_max_position_embeddings", 0, where));
  rope->originalMaxPositions = static_cast<int64_t>(original);
  ASSIGN_OR_RETURN(rope->betaFast, number(params, "beta_fast", rope->betaFast, where));
  ASSIGN_OR_RETURN(rope->betaSlow, number(params, "beta_slow", rope->betaSlow, where));
  ASSIGN_OR_RETURN(rope->mscale, number(params, "mscale", rope->mscale, where));
  ASSIGN_OR_RETURN(rope->mscaleAllDim, number(params, "mscale_all_dim", rope->mscaleAllDim, where));
  ASSIGN_OR_RETURN(rope->attentionFactor, number(params, "attention_factor", rope->attentionFactor, where));
  RETURN_IF_ERROR(readBoolean(params, where, "truncate", &rope->truncate));
  if (rope->originalMaxPositions < 1)
    return invalidArgument("{}: original_max_position_embeddings must be positive, got {}", where,
                           rope->originalMaxPositions);
  return Status::ok();
}

Status parseRope(const json& j, const std::string& source, bool allowYarn, RopeConfig* rope) {
  // transformers 5 keeps theta and scaling together in rope_parameters; 4 has rope_theta and
  // rope_scaling (whose type is "rope_type", or "type" in older files).
  const json* params = nullptr;
  std::string where = source;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    params = &*it;
    where = source + ": rope_parameters";
  } else if (auto it = j.find("rope_scaling"); it != j.end() && it->is_object()) {
    params = &*it;
    where = source + ": rope_scaling";
  }
  ASSIGN_OR_RETURN(rope->theta, number(j, "rope_theta", rope->theta, source));
  if (!params) return Status::ok();
  ASSIGN_OR_RETURN(rope->theta, number(*params, "rope_theta", rope->theta, where));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (auto t = params->find(key); t != params->end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default") {
    rope->type = RopeConfig::Type::kDefault;
    return Status::ok();
  }
  ASSIGN_OR_RETURN(rope->factor, number(*params, "factor", 1.0, where));
  if (type == "linear") {
    rope->type = RopeConfig::Type::kLinear;
  } else if (type == "yarn" && allowYarn) {
    RETURN_IF_ERROR(parseYarn(*params, where, rope));
  } else if (type == "llama3") {
    rope->type = RopeConfig::Type::kLlama3;
    ASSIGN_OR_RETURN(rope->lowFreqFactor, number(*params, "low_freq_factor", rope->lowFreqFactor, where));
    ASSIGN_OR_RETURN(rope->highFreqFactor, number(*params, "high_freq_factor", rope->highFreqFactor, where));
    ASSIGN_OR_RETURN(double original, number(*params, "original_max_position_embeddings", 8192, where));
    rope->originalMaxPositions = static_cast<int64_t>(original);
    if (rope->highFreqFactor <= rope->lowFreqFactor)
      return invalidArgument("{}: high_freq_factor {} must be above low_freq_factor {}", where, rope->highFreqFactor,
                             rope->lowFreqFactor);
  } else {
    return invalidArgument("{}: rope_type \"{}\" is not supported (supported: default, linear, llama3{})", where, type,
                           allowYarn ? ", yarn" : "");
  }
  if (rope->factor <= 0) return invalidArgument("{}: factor must be positive, got {}", where, rope->factor);
  return Status::ok();
}

Status parseNumerics(const json& j, const std::string& source, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->rmsNormEps, number(j, "rms_norm_eps", c->rmsNormEps, source));
  ASSIGN_OR_RETURN(c->initializerRange, number(j, "initializer_range", c->initializerRange, source));
  ASSIGN_OR_RETURN(double maxPositions, number(j, "max_position_embeddings", double(c->maxPositionEmbeddings), source));
  c->maxPositionEmbeddings = static_cast<int64_t>(maxPositions);
  if (auto act = j.find("hidden_act"); act != j.end() && act->is_string() && act->get<std::string>() != "silu")
    return invalidArgument("{}: hidden_act: \"{}\" is not supported (Llama-family MLPs use silu)", source,
                           act->get<std::string>());
  // Only deepseek_v3 may ask for yarn: the families whose HF models Loom checks yarn against.
  RETURN_IF_ERROR(parseRope(j, source, c->family == ModelFamily::kDeepseekV3, &c->rope));
  // Mistral attends through a sliding window; Qwen's optional per-layer windows are not built.
  if (c->family == ModelFamily::kMistral || c->family == ModelFamily::kMixtral) {
    ASSIGN_OR_RETURN(double window, number(j, "sliding_window", 0, source));
    c->slidingWindow = static_cast<int64_t>(window);
  } else if (auto it = j.find("use_sliding_window"); it != j.end() && it->is_boolean() && it->get<bool>()) {
    return invalidArgument("{}: use_sliding_window: per-layer sliding-window attention is not supported yet", source);
  }
  return Status::ok();
}

// Multi-head latent attention (deepseek_v3); num_attention_heads and num_key_value_heads are read.
Status parseLatentAttention(const json& j, const std::string& source, ModelConfig* c) {
  // kv_b_proj gives every query head its own key and value; HF's attention would repeat fewer KV
  // heads into more heads than the keys have.
  if (c->numKvHeads != c->numHeads)
    return invalidArgument("{}: num_key_value_heads {} must equal num_attention_heads {} for deepseek_v3 (latent "
                           "attention gives every query head its own key and value)",
                           source, c->numKvHeads, c->numHeads);
  MlaConfig& m = c->mla;
  // A null q_lora_rank means a plain q_proj, so the field must be there: HF's default for a missing
  // one is a 1536-wide query latent, which a config should say rather than imply.
  if (!j.contains("q_lora_rank"))
    return invalidArgument("{}: q_lora_rank: required field is missing (null for a plain q_proj)", source);
  RETURN_IF_ERROR(readInteger(j, source, "q_lora_rank", &m.qLoraRank, false, 1));
  RETURN_IF_ERROR(readInteger(j, source, "kv_lora_rank", &m.kvLoraRank, true, 1));
  RETURN_IF_ERROR(readInteger(j, source, "qk_nope_head_dim", &m.qkNopeHeadDim, true, 1));
  RETURN_IF_ERROR(readInteger(j, source, "qk_rope_head_dim", &m.qkRopeHeadDim, true, 1));
  RETURN_IF_ERROR(readInteger(j, source, "v_head_dim", &m.vHeadDim, true, 1));
  RETURN_IF_ERROR(readBoolean(j, source, "rope_interleave", &m.ropeInterleave));
  c->headDim = m.qkRopeHeadDim;  // HF overrides any head_dim with the rotary width
  return Status::ok();
}

// DeepSeek-V3's experts: routed ones from layer first_k_dense_replace on, shared ones beside them,
// and a group-limited sigmoid router with a score-correction bias. The fields that decide the
// parameters are required; the routing ones take HF's defaults.
Status parseDeepseekExperts(const json& j, const std::string& source, ModelConfig* c) {
  RETURN_IF_ERROR(readInteger(j, source, "n_routed_experts", &c->numExperts, true, 1));
  RETURN_IF_ERROR(readInteger(j, source, "moe_intermediate_size", &c->expertIntermediateSize, true, 1));
  int64_t shared = 0;
  RETURN_IF_ERROR(readInteger(j, source, "n_shared_experts", &shared, true, 1));
  c->sharedExpertIntermediateSize = c->expertIntermediateSize * shared;  // HF builds them as one wider MLP
  RETURN_IF_ERROR(readInteger(j, source, "first_k_dense_replace", &c->firstDenseLayers, true, 0));
  // HF's DeepseekV3 ignores moe_layer_freq and puts experts in every layer from
  // first_k_dense_replace on; DeepSeek's own code would alternate. Only 1 means the same in both.
  int64_t layerFreq = 1;
  RETURN_IF_ERROR(readInteger(j, source, "moe_layer_freq", &layerFreq, false, 1));
  if (layerFreq != 1)
    return invalidArgument("{}: moe_layer_freq: {} is not supported (deepseek_v3 has experts in every layer from "
                           "first_k_dense_replace on: moe_layer_freq 1)",
                           source, layerFreq);

  RouterConfig& r = c->router;
  r.scoring = RouterConfig::Scoring::kSigmoid;
  r.scoreCorrectionBias = true;
  RETURN_IF_ERROR(requireStringIfGiven(j, source, "scoring_func", "sigmoid",
                                       "deepseek_v3 scores experts with a sigmoid"));
  RETURN_IF_ERROR(requireStringIfGiven(j, source, "topk_method", "noaux_tc",
                                       "deepseek_v3 picks experts by group with the score-correction bias: noaux_tc"));
  r.normalizeTopK = true;
  RETURN_IF_ERROR(readBoolean(j, source, "norm_topk_prob", &r.normalizeTopK));
  r.scalingFactor = 2.5;
  ASSIGN_OR_RETURN(r.scalingFactor, number(j, "routed_scaling_factor", r.scalingFactor, source));
  if (r.scalingFactor <= 0)
    return invalidArgument("{}: routed_scaling_factor: must be positive, got {}", source, r.scalingFactor);
  r.groups = 8;
  r.groupsPerToken = 4;
  RETURN_IF_ERROR(readInteger(j, source, "n_group", &r.groups, false, 1));
  RETURN_IF_ERROR(readInteger(j, source, "topk_group", &r.groupsPerToken, false, 1));
  if (c->numExperts % r.groups != 0)
    return invalidArgument("{}: n_routed_experts {} does not split into n_group {} equal groups", source,
                           c->numExperts, r.groups);
  // A group scores as the sum of its best two experts.
  if (c->numExperts / r.groups < 2)
    return invalidArgument("{}: n_group {}: each group needs at least 2 of the {} experts", source, r.groups,
                           c->numExperts);
  if (r.groupsPerToken > r.groups)
    return invalidArgument("{}: topk_group {} is above n_group {}", source, r.groupsPerToken, r.groups);
  return Status::ok();
}

}  // namespace

StatusOr<ModelConfig> parseModelConfig(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // a parse error, or out_of_range: a number too large
    return invalidArgument("{}: not valid JSON: {}", source, e.what());
  }
  if (!j.is_object()) return invalidArgument("{}: must be a JSON object", source);

  auto integer = [&](const char* key, int64_t* out, bool required, int64_t min) {
    return readInteger(j, source, key, out, required, min);
  };
  auto boolean = [&](const char* key, bool* out) { return readBoolean(j, source, key, out); };

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
  } else if (modelType == "deepseek_v3") {
    c.family = ModelFamily::kDeepseekV3;
  } else {
    return invalidArgument("{}: model_type: \"{}\" is not a model this version builds (supported: llama, mistral, "
                           "qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, deepseek_v3)",
                           source, modelType);
  }
  RETURN_IF_ERROR(integer("vocab_size", &c.vocabSize, true, 1));
  RETURN_IF_ERROR(integer("hidden_size", &c.hiddenSize, true, 1));
  RETURN_IF_ERROR(integer("intermediate_size", &c.intermediateSize, true, 1));
  RETURN_IF_ERROR(integer("num_hidden_layers", &c.numLayers, true, 1));
  RETURN_IF_ERROR(integer("num_attention_heads", &c.numHeads, true, 1));
  c.numKvHeads = c.numHeads;
  RETURN_IF_ERROR(integer("num_key_value_heads", &c.numKvHeads, false, 1));
  if (c.family == ModelFamily::kDeepseekV3) {
    RETURN_IF_ERROR(parseLatentAttention(j, source, &c));
  } else {
    if (c.numHeads % c.numKvHeads != 0)
      return invalidArgument("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
                             c.numHeads, c.numKvHeads);
    c.headDim = c.hiddenSize / c.numHeads;
    RETURN_IF_ERROR(integer("head_dim", &c.headDim, false, 1));
    if (!j.contains("head_dim") && c.hiddenSize % c.numHeads != 0)
      return invalidArgument(
          "{}: hidden_size {} is not a multiple of num_attention_heads {} (and head_dim is not given)", source,
          c.hiddenSize, c.numHeads);
  }
  RETURN_IF_ERROR(boolean("tie_word_embeddings", &c.tieWordEmbeddings));
  RETURN_IF_ERROR(boolean("attention_bias", &c.attentionBias));
  // HF's DeepseekV3MLP has no biases whatever mlp_bias says.
  if (c.family != ModelFamily::kDeepseekV3) RETURN_IF_ERROR(boolean("mlp_bias", &c.mlpBias));
  // Qwen2 always has q/k/v biases and no o_proj bias; Qwen3 normalizes q and k per head.
  if (c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen2Moe) c.attentionBias = true;
  if (c.family == ModelFamily::kQwen3 || c.family == ModelFamily::kQwen3Moe) c.qkNorm = true;
  if (c.family == ModelFamily::kMixtral) {
    RETURN_IF_ERROR(integer("num_local_experts", &c.numExperts, true, 1));
    c.expertIntermediateSize = c.intermediateSize;
    c.router.normalizeTopK = true;  // Mixtral always rescales its top-k softmax weights to sum to 1
  } else if (c.family == ModelFamily::kDeepseekV3) {
    RETURN_IF_ERROR(parseDeepseekExperts(j, source, &c));
  } else if (c.family == ModelFamily::kQwen2Moe || c.family == ModelFamily::kQwen3Moe) {
    RETURN_IF_ERROR(boolean("norm_topk_prob", &c.router.normalizeTopK));
    // transformers 5 writes qwen3_moe's num_experts under its attribute name, num_local_experts.
    const bool localName = !j.contains("num_experts") && j.contains("num_local_experts");
    RETURN_IF_ERROR(integer(localName ? "num_local_experts" : "num_experts", &c.numExperts, true, 1));
    if (c.family == ModelFamily::kQwen2Moe)
      RETURN_IF_ERROR(integer("shared_expert_intermediate_size", &c.sharedExpertIntermediateSize, true, 1));
    RETURN_IF_ERROR(integer("moe_intermediate_size", &c.expertIntermediateSize, true, 1));
    RETURN_IF_ERROR(integer("decoder_sparse_step", &c.sparseStep, false, 1));
    if (auto dense = j.find("mlp_only_layers"); dense != j.end() && !dense->is_null()) {
      if (!dense->is_array()) return invalidArgument("{}: mlp_only_layers: must be a list of layer indices", source);
      for (const auto& layer : *dense) {
        if (!layer.is_number_integer() || layer.get<int64_t>() < 0 || layer.get<int64_t>() >= c.numLayers)
          return invalidArgument("{}: mlp_only_layers: {} is not a layer index (0 to {})", source, layer.dump(),
                                 c.numLayers - 1);
        c.mlpOnlyLayers.push_back(layer.get<int64_t>());
      }
    }
  }
  if (c.family == ModelFamily::kMixtral || c.family == ModelFamily::kQwen2Moe || c.family == ModelFamily::kQwen3Moe) {
    RETURN_IF_ERROR(boolean("output_router_logits", &c.outputRouterLogits));
    ASSIGN_OR_RETURN(c.routerAuxLossCoef, number(j, "router_aux_loss_coef", c.routerAuxLossCoef, source));
    // Mixtral's jitter multiplies the router's input by noise while training; not built.
    ASSIGN_OR_RETURN(const double jitter, number(j, "router_jitter_noise", 0.0, source));
    if (jitter != 0.0)
      return invalidArgument("{}: router_jitter_noise: {} is not supported (0: no noise on the router's input)",
                             source, jitter);
  }
  RETURN_IF_ERROR(parseNumerics(j, source, &c));
  if (c.isMoe()) {
    RETURN_IF_ERROR(integer("num_experts_per_tok", &c.expertsPerToken, true, 1));
    if (c.expertsPerToken > c.numExperts)
      return invalidArgument("{}: num_experts_per_tok {} is above the {} experts", source, c.expertsPerToken,
                             c.numExperts);
    const int64_t reachable = c.router.groupsPerToken * (c.numExperts / c.router.groups);
    if (c.expertsPerToken > reachable)
      return invalidArgument("{}: num_experts_per_tok {} is above the {} experts of the topk_group {} groups a token "
                             "picks from",
                             source, c.expertsPerToken, reachable, c.router.groupsPerToken);
  }
  return c;
}

}  // namespace loom::planner
