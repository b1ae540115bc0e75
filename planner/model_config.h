#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::planner {

enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3, kMixtral, kQwen2Moe, kQwen3Moe, kDeepseekV3 };
const char* modelFamilyName(ModelFamily family);

// Rotary position embedding: HF's rope_parameters (transformers 5) or rope_theta + rope_scaling
// (transformers 4). Types default, linear and llama3; yarn for deepseek_v3 only (as HF's
// DeepSeek-V3 builds it); others are refused by name.
struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3, kYarn };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  double lowFreqFactor = 1.0;            // llama3
  double highFreqFactor = 4.0;           // llama3
  int64_t originalMaxPositions = 8192;   // llama3, yarn: original_max_position_embeddings
  double betaFast = 32.0;                // yarn: beta_fast
  double betaSlow = 1.0;                 // yarn: beta_slow
  double mscale = 0.0;                   // yarn: mscale; 0 when absent
  double mscaleAllDim = 0.0;             // yarn: mscale_all_dim; 0 when absent (MLA's softmax scale uses it too)
  double attentionFactor = 0.0;          // yarn: attention_factor; 0: derived from factor and the mscales
  bool truncate = true;                  // yarn: truncate, rounding the correction range to whole dimensions
};

// Multi-head latent attention (deepseek_v3): queries and keys/values are projected down to
// low-rank latents, normalized, and projected back up per head. Every query head gets its own key
// and value (num_key_value_heads equals num_attention_heads); a query/key head is a part without
// rotary (qk_nope_head_dim) followed by a rotary part (qk_rope_head_dim) whose key is shared by all
// heads.
struct MlaConfig {
  int64_t qLoraRank = 0;       // q_lora_rank; 0 (null in config.json): a plain q_proj, no query latent
  int64_t kvLoraRank = 0;      // kv_lora_rank; 0: not MLA
  int64_t qkNopeHeadDim = 0;   // qk_nope_head_dim
  int64_t qkRopeHeadDim = 0;   // qk_rope_head_dim
  int64_t vHeadDim = 0;        // v_head_dim
  bool ropeInterleave = true;  // rope_interleave: rotary pairs are adjacent, not split in halves
  int64_t qkHeadDim() const { return qkNopeHeadDim + qkRopeHeadDim; }
};

// How a mixture-of-experts router picks and weights a token's experts. The parameters do not
// depend on it; expert parallelism (DeepSpeed's AutoEP: score_func, route_norm, route_scale,
// num_expert_groups, num_limited_groups) does.
struct RouterConfig {
  enum class Scoring { kSoftmax, kSigmoid };
  Scoring scoring = Scoring::kSoftmax;  // scoring_func: softmax (mixtral, qwen*_moe), sigmoid (deepseek_v3)
  bool normalizeTopK = false;           // norm_topk_prob: the chosen experts' weights rescaled to sum to 1
  double scalingFactor = 1.0;           // routed_scaling_factor: multiplies the chosen experts' weights
  int64_t groups = 1;                   // n_group: the experts form this many equal groups...
  int64_t groupsPerToken = 1;           // topk_group: ...and a token picks its experts from this many of them
  // deepseek_v3's mlp.gate.e_score_correction_bias: added to the scores to choose the experts, not
  // to weight them; learned by the load-balancing rule, not by gradients.
  bool scoreCorrectionBias = false;
};

// How the routed experts compute their MLP from the gate and up projections: the activation as
// AutoEP's expert_activation names it (DeepSpeed 0.19.8's forms), and whether gate and up run as
// one GEMM over their concatenated weights (gate_up_impl "fused"). Shared experts keep SwiGLU.
struct ExpertMlpConfig {
  enum class Activation {
    kSwiglu,         // silu(gate) * up: mixtral, qwen*_moe, deepseek_v3
    kGegluTanh,      // gelu_tanh(gate) * up
    kSwigluClamped,  // silu(min(gate, limit)) * clamp(up, -limit, limit)
    kSwigluOai,      // (clamp(up) + 1) * g * sigmoid(alpha * g), g = min(gate, limit) (GPT-OSS)
  };
  Activation activation = Activation::kSwiglu;
  double alpha = 1.702;  // swiglu_oai's, as AutoEP's presets default it
  double limit = 7.0;    // the clamped forms'
  bool fusedGateUp = false;
};
const char* expertActivationName(ExpertMlpConfig::Activation activation);
// The activation named `name` (swiglu, geglu_tanh, swiglu_clamped, swiglu_oai); false if none is.
bool parseExpertActivation(const std::string& name, ExpertMlpConfig::Activation* out);

// The fields of a Hugging Face decoder `config.json` that decide the parameters, with HF's
// defaults. Llama-family decoders, dense and mixture-of-experts (Mixtral, Qwen2-MoE, Qwen3-MoE),
// and DeepSeek-V3 (latent attention, dense first layers, routed and shared experts).
struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numLayers = 0;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;        // num_key_value_heads, default num_attention_heads
  // head_dim, default hidden_size / num_attention_heads. Under MLA it is qk_rope_head_dim, the
  // rotary width, as HF sets it; the widths of the attention heads are in `mla`.
  int64_t headDim = 0;
  bool tieWordEmbeddings = false;
  bool attentionBias = false;    // q/k/v biases (qwen2 always; llama's attention_bias)
  bool qkNorm = false;           // per-head RMSNorm of q and k (qwen3)
  bool mlpBias = false;
  MlaConfig mla;                 // deepseek_v3
  bool isMla() const { return mla.kvLoraRank > 0; }
  // Mixture of experts: 0 experts for a dense model.
  int64_t numExperts = 0;              // num_local_experts (mixtral), num_experts (qwen*_moe), n_routed_experts
  int64_t expertsPerToken = 0;         // num_experts_per_tok
  int64_t expertIntermediateSize = 0;  // moe_intermediate_size (qwen*_moe, deepseek_v3); intermediate_size for mixtral
  // The shared experts every token goes through, as one MLP of this width; 0: none.
  // shared_expert_intermediate_size (qwen2_moe); moe_intermediate_size x n_shared_experts (deepseek_v3).
  int64_t sharedExpertIntermediateSize = 0;
  // first_k_dense_replace (deepseek_v3): layers below this index have a dense MLP of
  // intermediate_size instead of experts.
  int64_t firstDenseLayers = 0;
  // decoder_sparse_step and mlp_only_layers (qwen*_moe): layer l has experts when (l + 1) is a
  // multiple of the step and l is not listed; the others have a dense MLP of intermediate_size.
  int64_t sparseStep = 1;
  std::vector<int64_t> mlpOnlyLayers;
  RouterConfig router;
  ExpertMlpConfig expertMlp;  // not in config.json: AutoEP's settings (expert_parallel) choose it
  // The router's load-balancing loss (output_router_logits, router_aux_loss_coef: mixtral and
  // qwen*_moe), added to the loss as transformers adds it; deepseek_v3 has none.
  bool outputRouterLogits = false;
  double routerAuxLossCoef = 0.001;
  bool isMoe() const { return numExperts > 0; }
  bool isMoeLayer(int64_t layer) const;
  int64_t numMoeLayers() const;

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
