#include "planner/model_parameters.h"

#include <fmt/format.h>

#include "common/shape.h"

namespace loom::planner {

int64_t ParameterInfo::numel() const { return numelOf(shape); }

namespace {

void appendAttention(const ModelConfig& c, const std::string& p, std::vector<ParameterInfo>& out) {
  const int64_t h = c.hiddenSize, q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim;
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
}

// DeepSeek's latent attention: the query through an optional low-rank latent, keys and values
// through a shared latent plus one rotary key for all heads. attention_bias puts biases on the
// projections out of the hidden state (q_a, kv_a) and on o_proj, never on q_proj or the up
// projections (q_b, kv_b).
void appendLatentAttention(const ModelConfig& c, const std::string& p, std::vector<ParameterInfo>& out) {
  const MlaConfig& m = c.mla;
  const int64_t h = c.hiddenSize, heads = c.numHeads;
  const std::string a = p + "self_attn.";
  if (m.qLoraRank == 0) {
    out.push_back({a + "q_proj.weight", {heads * m.qkHeadDim(), h}});
  } else {
    out.push_back({a + "q_a_proj.weight", {m.qLoraRank, h}});
    if (c.attentionBias) out.push_back({a + "q_a_proj.bias", {m.qLoraRank}});
    out.push_back({a + "q_a_layernorm.weight", {m.qLoraRank}});
    out.push_back({a + "q_b_proj.weight", {heads * m.qkHeadDim(), m.qLoraRank}});
  }
  out.push_back({a + "kv_a_proj_with_mqa.weight", {m.kvLoraRank + m.qkRopeHeadDim, h}});
  if (c.attentionBias) out.push_back({a + "kv_a_proj_with_mqa.bias", {m.kvLoraRank + m.qkRopeHeadDim}});
  out.push_back({a + "kv_a_layernorm.weight", {m.kvLoraRank}});
  out.push_back({a + "kv_b_proj.weight", {heads * (m.qkNopeHeadDim + m.vHeadDim), m.kvLoraRank}});
  out.push_back({a + "o_proj.weight", {h, heads * m.vHeadDim}});
  if (c.attentionBias) out.push_back({a + "o_proj.bias", {h}});
}

void appendDenseMlp(const ModelConfig& c, const std::string& p, std::vector<ParameterInfo>& out) {
  const int64_t h = c.hiddenSize, i = c.intermediateSize;
  out.push_back({p + "mlp.gate_proj.weight", {i, h}});
  if (c.mlpBias) out.push_back({p + "mlp.gate_proj.bias", {i}});
  out.push_back({p + "mlp.up_proj.weight", {i, h}});
  if (c.mlpBias) out.push_back({p + "mlp.up_proj.bias", {i}});
  out.push_back({p + "mlp.down_proj.weight", {h, i}});
  if (c.mlpBias) out.push_back({p + "mlp.down_proj.bias", {h}});
}

// The router, then every expert's SwiGLU (Mixtral names them w1 gate, w3 up, w2 down), then the
// shared experts.
void appendExperts(const ModelConfig& c, const std::string& p, std::vector<ParameterInfo>& out) {
  const int64_t h = c.hiddenSize, e = c.numExperts, i = c.expertIntermediateSize;
  const bool mixtral = c.family == ModelFamily::kMixtral;
  const bool deepseek = c.family == ModelFamily::kDeepseekV3;
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  out.push_back({moe + "gate.weight", {e, h}});
  if (c.router.scoreCorrectionBias)
    out.push_back({.name = moe + "gate.e_score_correction_bias", .shape = {e}, .trainable = false});
  for (int64_t x = 0; x < e; ++x) {
    const std::string ex = fmt::format("{}experts.{}.", moe, x);
    const int id = static_cast<int>(x);
    if (deepseek) {  // in the order of DeepSeek's MLP module
      out.push_back({ex + "gate_proj.weight", {i, h}, id});
      out.push_back({ex + "up_proj.weight", {i, h}, id});
      out.push_back({ex + "down_proj.weight", {h, i}, id});
      continue;
    }
    out.push_back({ex + (mixtral ? "w1.weight" : "gate_proj.weight"), {i, h}, id});
    out.push_back({ex + (mixtral ? "w2.weight" : "down_proj.weight"), {h, i}, id});
    out.push_back({ex + (mixtral ? "w3.weight" : "up_proj.weight"), {i, h}, id});
  }
  if (c.sharedExpertIntermediateSize == 0) return;
  const int64_t s = c.sharedExpertIntermediateSize;
  if (deepseek) {
    // n_shared_experts experts every token goes through, built as one MLP of their summed width.
    out.push_back({moe + "shared_experts.gate_proj.weight", {s, h}});
    out.push_back({moe + "shared_experts.up_proj.weight", {s, h}});
    out.push_back({moe + "shared_experts.down_proj.weight", {h, s}});
    return;
  }
  // Qwen2-MoE: one dense expert every token goes through, scaled by its own sigmoid gate.
  out.push_back({moe + "shared_expert.gate_proj.weight", {s, h}});
  out.push_back({moe + "shared_expert.up_proj.weight", {s, h}});
  out.push_back({moe + "shared_expert.down_proj.weight", {h, s}});
  out.push_back({moe + "shared_expert_gate.weight", {1, h}});
}

}  // namespace

std::vector<ParameterInfo> enumerateParameters(const ModelConfig& c) {
  const int64_t h = c.hiddenSize;
  std::vector<ParameterInfo> out;
  out.push_back({"model.embed_tokens.weight", {c.vocabSize, h}});
  for (int64_t l = 0; l < c.numLayers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const size_t first = out.size();
    out.push_back({p + "input_layernorm.weight", {h}});
    if (c.isMla()) {
      appendLatentAttention(c, p, out);
    } else {
      appendAttention(c, p, out);
    }
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    if (c.isMoeLayer(l)) {
      appendExperts(c, p, out);
    } else {
      appendDenseMlp(c, p, out);
    }
    for (size_t i = first; i < out.size(); ++i) out[i].layer = static_cast<int>(l);
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
