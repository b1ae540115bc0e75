#include "planner/tensor_parallel.h"

#include <regex>

namespace loom::planner {

const char* tpSplitName(TpSplit split) {
  switch (split) {
    case TpSplit::kReplicated: return "replicated";
    case TpSplit::kColumn: return "column";
    case TpSplit::kRow: return "row";
    case TpSplit::kVocab: return "vocab";
  }
  return "?";
}

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The default rule, by what the parameter is.
TpSplit defaultSplit(const ParameterInfo& p) {
  const std::string& n = p.name;
  if (n == "model.embed_tokens.weight" || n == "lm_head.weight") return TpSplit::kVocab;
  // Routers stay whole (DeepSpeed skips mlp.gate, block_sparse_moe.gate and shared_expert_gate),
  // and so does deepseek_v3's router bias.
  if (endsWith(n, "mlp.gate.weight") || endsWith(n, "block_sparse_moe.gate.weight") ||
      endsWith(n, "shared_expert_gate.weight") || endsWith(n, "mlp.gate.e_score_correction_bias"))
    return TpSplit::kReplicated;
  // Latent attention (DeepSpeed's deepseek_v2 preset): the projections down to the latents stay
  // whole with their biases, so every rank has the whole latent to normalize (its norms are whole
  // like every norm); q_b_proj and kv_b_proj then split by heads like q/k/v, and o_proj by rows.
  if (n.find("self_attn.q_a_proj.") != std::string::npos ||
      n.find("self_attn.kv_a_proj_with_mqa.") != std::string::npos)
    return TpSplit::kReplicated;
  if (n.find("o_proj.") != std::string::npos || n.find("down_proj.") != std::string::npos || n.find(".w2.") != std::string::npos)
    return endsWith(n, ".bias") ? TpSplit::kReplicated : TpSplit::kRow;  // a row-parallel bias is added once, whole
  if (n.find("_proj.") != std::string::npos || n.find(".w1.") != std::string::npos || n.find(".w3.") != std::string::npos)
    return TpSplit::kColumn;
  return TpSplit::kReplicated;  // norms (including qwen3's per-head q/k norms)
}

bool isKeyOrValue(const std::string& name) {
  return name.find("k_proj.") != std::string::npos || name.find("v_proj.") != std::string::npos;
}

}  // namespace

StatusOr<std::vector<TpLayout>> layoutTensorParallel(const ModelConfig& c, const std::vector<ParameterInfo>& parameters,
                                                     int tp, const std::vector<TpLayerSpec>& specs) {
  if (tp < 1) return invalidArgument("tensor_parallel.autotp_size: must be at least 1, got {}", tp);
  if (c.numHeads % tp != 0)
    return invalidArgument("tensor parallel {}: num_attention_heads {} is not a multiple of it", tp, c.numHeads);
  int kvReplication = 1;
  if (c.numKvHeads % tp != 0) {
    if (tp % c.numKvHeads != 0)
      return invalidArgument("tensor parallel {}: num_key_value_heads {} neither divides it nor is divided by it, so "
                             "the KV heads cannot be aligned with the query heads",
                             tp, c.numKvHeads);
    kvReplication = tp / static_cast<int>(c.numKvHeads);  // each rank holds one KV head, shared by tp/kv ranks
  }
  const bool denseMlps = !c.isMoe() || c.firstDenseLayers > 0;  // deepseek_v3's first layers are dense
  if (denseMlps && c.intermediateSize % tp != 0)
    return invalidArgument("tensor parallel {}: intermediate_size {} is not a multiple of it", tp, c.intermediateSize);
  if (c.sharedExpertIntermediateSize % tp != 0)
    return invalidArgument("tensor parallel {}: {} {} is not a multiple of it", tp,
                           c.family == ModelFamily::kDeepseekV3 ? "moe_intermediate_size x n_shared_experts"
                                                                : "shared_expert_intermediate_size",
                           c.sharedExpertIntermediateSize);
  if (c.isMoe() && c.expertIntermediateSize % tp != 0)
    return invalidArgument("tensor parallel {}: the experts' intermediate size {} is not a multiple of it", tp,
                           c.expertIntermediateSize);
  if (c.vocabSize % tp != 0)
    return invalidArgument("tensor parallel {}: vocab_size {} is not a multiple of it (the embedding and head are "
                           "split by vocabulary)",
                           tp, c.vocabSize);

  std::vector<std::regex> patterns;
  for (const auto& s : specs) {
    try {
      patterns.emplace_back(s.pattern);
    } catch (const std::regex_error& e) {
      return invalidArgument("tensor_parallel.partition_config.layer_specs: pattern \"{}\" is not a regex: {}",
                             s.pattern, e.what());
    }
  }

  std::vector<TpLayout> out;
  out.reserve(parameters.size());
  for (const auto& p : parameters) {
    TpLayout layout{.split = defaultSplit(p), .localShape = p.shape, .kvReplication = 1};
    for (size_t i = 0; i < specs.size(); ++i) {
      if (std::regex_search(p.name, patterns[i])) {
        layout.split = specs[i].split;
        break;
      }
    }
    if (layout.split == TpSplit::kRow && p.shape.size() < 2) layout.split = TpSplit::kReplicated;
    const int dim = layout.split == TpSplit::kRow ? 1 : 0;
    if (layout.split != TpSplit::kReplicated) {
      int64_t parts = tp;
      if (isKeyOrValue(p.name) && layout.split == TpSplit::kColumn && kvReplication > 1) {
        parts = c.numKvHeads;  // one KV head per rank, replicated
        layout.kvReplication = kvReplication;
      }
      if (p.shape[dim] % parts != 0)
        return invalidArgument("{} {}: dimension {} of size {} does not split into {} parts", p.name,
                               tpSplitName(layout.split), dim, p.shape[dim], parts);
      layout.localShape[dim] = p.shape[dim] / parts;
    }
    out.push_back(std::move(layout));
  }
  return out;
}

}  // namespace loom::planner
