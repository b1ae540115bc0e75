#include "planner/model_parameters.h"

#include <fmt/format.h>

namespace loom::planner {

int64_t ParameterInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<ParameterInfo> enumerateParameters(const ModelConfig& c) {
  const int64_t h = c.hiddenSize, q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim;
  std::vector<ParameterInfo> out;
  out.push_back({"model.embed_tokens.weight", {c.vocabSize, h}});
  for (int64_t l = 0; l < c.numLayers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    if (c.attentionBias) out.push_back({p + "self_attn.q_proj.bias", {q}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    if (c.attentionBias) out.push_back({p + "self_attn.k_proj.bias", {kv}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    if (c.attentionBias) out.push_back({p + "self_attn.v_proj.bias", {kv}});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    // Llama's attention_bias covers o_proj too; Qwen2's (and Qwen2-MoE's) are on q, k and v only.
    const bool qwen2Style = c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen2Moe;
    if (c.attentionBias && !qwen2Style) out.push_back({p + "self_attn.o_proj.bias", {h}});
    if (c.qkNorm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.headDim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.headDim}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    if (c.isMoe()) {
      // The router, then every expert's SwiGLU (Mixtral names them w1 gate, w3 up, w2 down).
      const int64_t e = c.numExperts, i = c.expertIntermediateSize;
      const bool mixtral = c.family == ModelFamily::kMixtral;
      const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
      out.push_back({moe + "gate.weight", {e, h}});
      for (int64_t x = 0; x < e; ++x) {
        const std::string ex = fmt::format("{}experts.{}.", moe, x);
        const int id = static_cast<int>(x);
        out.push_back({ex + (mixtral ? "w1.weight" : "gate_proj.weight"), {i, h}, id});
        out.push_back({ex + (mixtral ? "w2.weight" : "down_proj.weight"), {h, i}, id});
        out.push_back({ex + (mixtral ? "w3.weight" : "up_proj.weight"), {i, h}, id});
      }
      if (c.sharedExpertIntermediateSize > 0) {
        // Qwen2-MoE: one dense expert every token goes through, scaled by its own sigmoid gate.
        const int64_t s = c.sharedExpertIntermediateSize;
        out.push_back({moe + "shared_expert.gate_proj.weight", {s, h}});
        out.push_back({moe + "shared_expert.up_proj.weight", {s, h}});
        out.push_back({moe + "shared_expert.down_proj.weight", {h, s}});
        out.push_back({moe + "shared_expert_gate.weight", {1, h}});
      }
      continue;
    }
    out.push_back({p + "mlp.gate_proj.weight", {c.intermediateSize, h}});
    if (c.mlpBias) out.push_back({p + "mlp.gate_proj.bias", {c.intermediateSize}});
    out.push_back({p + "mlp.up_proj.weight", {c.intermediateSize, h}});
    if (c.mlpBias) out.push_back({p + "mlp.up_proj.bias", {c.intermediateSize}});
    out.push_back({p + "mlp.down_proj.weight", {h, c.intermediateSize}});
    if (c.mlpBias) out.push_back({p + "mlp.down_proj.bias", {h}});
  }
  out.push_back({"model.norm.weight", {h}});
  if (!c.tieWordEmbeddings) out.push_back({"lm_head.weight", {c.vocabSize, h}});
  return out;
}

int64_t countParameters(const std::vector<ParameterInfo>& parameters) {
  int64_t n = 0;
  for (const auto& p : parameters) n += p.numel();
  return n;
}

}  // namespace loom::planner
