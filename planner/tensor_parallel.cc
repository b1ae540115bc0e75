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

const char* layerRoleName(LayerRole role) {
  switch (role) {
    case LayerRole::kEmbedding: return "embed";
    case LayerRole::kHead: return "head";
    case LayerRole::kNorm: return "norm";
    case LayerRole::kQuery: return "q";
    case LayerRole::kKey: return "k";
    case LayerRole::kValue: return "v";
    case LayerRole::kKeyValue: return "kv";
    case LayerRole::kLatent: return "latent";
    case LayerRole::kAttentionOutput: return "o";
    case LayerRole::kGate: return "gate";
    case LayerRole::kUp: return "up";
    case LayerRole::kDown: return "down";
    case LayerRole::kRouter: return "router";
    case LayerRole::kSharedExpertGate: return "shared_expert_gate";
    case LayerRole::kOther: return "other";
  }
  return "?";
}

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The default rule, by what the parameter is.
TpSplit defaultSplit(LayerRole role, const ParameterInfo& p) {
  switch (role) {
    case LayerRole::kEmbedding:
    case LayerRole::kHead:
      return TpSplit::kVocab;
    // Routers stay whole (DeepSpeed skips mlp.gate, block_sparse_moe.gate and shared_expert_gate).
    // Latent attention (DeepSpeed's deepseek_v2 preset): the projections down to the latents stay
    // whole with their biases, so every rank has the whole latent to normalize (its norms are
    // whole like every norm); q_b_proj and kv_b_proj then split by heads like q/k/v.
    case LayerRole::kRouter:
    case LayerRole::kSharedExpertGate:
    case LayerRole::kLatent:
    case LayerRole::kNorm:
    case LayerRole::kOther:
      return TpSplit::kReplicated;
    case LayerRole::kAttentionOutput:
    case LayerRole::kDown:
      return endsWith(p.name, ".bias") ? TpSplit::kReplicated : TpSplit::kRow;  // a row-parallel bias is added once, whole
    case LayerRole::kQuery:
    case LayerRole::kKey:
    case LayerRole::kValue:
    case LayerRole::kKeyValue:
    case LayerRole::kGate:
    case LayerRole::kUp:
      return TpSplit::kColumn;
  }
  return TpSplit::kReplicated;
}

struct CompiledSpec {
  size_t spec;
  std::regex pattern;
};

std::string specPath(size_t i) { return fmt::format("deepspeed.tensor_parallel.partition_config.layer_specs[{}]", i); }

// Applies a layer spec's `shape` to the parameter: the other dimensions must be as given, and the
// sub-parameters packed along the split dimension must each split into `parts`.
Status applyShape(const TpLayerSpec& spec, size_t index, const ParameterInfo& p, int64_t parts, TpLayout& layout) {
  if (spec.shape.size() != p.shape.size())
    return invalidArgument("{}.shape: has {} dimensions, {} has {}", specPath(index), spec.shape.size(), p.name,
                           p.shape.size());
  for (size_t d = 0; d < p.shape.size(); ++d) {
    const TpShapeDim& s = spec.shape[d];
    if (static_cast<int>(d) != layout.splitDim) {
      if (s.size != -1 && s.size != p.shape[d])
        return invalidArgument("{}.shape: dimension {} is {}, but {} has {}", specPath(index), d, s.size, p.name,
                               p.shape[d]);
      continue;
    }
    std::vector<int64_t> subs = s.subParams;
    if (subs.empty() && s.count > 1) subs.assign(s.count, p.shape[d] / s.count);
    int64_t sum = 0;
    for (int64_t x : subs) sum += x;
    if (!subs.empty() && sum != p.shape[d])
      return invalidArgument("{}.shape: the sub-parameters of dimension {} add up to {}, but {} has {}",
                             specPath(index), d, sum, p.name, p.shape[d]);
    for (int64_t x : subs) {
      if (x % parts != 0)
        return invalidArgument("{}.shape: {}'s sub-parameter of {} does not split into {} parts", specPath(index),
                               p.name, x, parts);
      layout.subParams.push_back(x / parts);
    }
  }
  return Status::ok();
}

}  // namespace

LayerRole layerRole(const ParameterInfo& p) {
  const std::string& n = p.name;
  if (n == "model.embed_tokens.weight") return LayerRole::kEmbedding;
  if (n == "lm_head.weight") return LayerRole::kHead;
  if (endsWith(n, "mlp.gate.weight") || endsWith(n, "block_sparse_moe.gate.weight") ||
      endsWith(n, "mlp.gate.e_score_correction_bias"))
    return LayerRole::kRouter;
  if (endsWith(n, "shared_expert_gate.weight")) return LayerRole::kSharedExpertGate;
  if (contains(n, "norm.")) return LayerRole::kNorm;  // *_layernorm, q_norm, k_norm, model.norm
  if (contains(n, "self_attn.q_a_proj.") || contains(n, "self_attn.kv_a_proj_with_mqa.")) return LayerRole::kLatent;
  if (contains(n, "q_proj.") || contains(n, "q_b_proj.")) return LayerRole::kQuery;
  if (contains(n, "kv_b_proj.")) return LayerRole::kKeyValue;
  if (contains(n, "k_proj.")) return LayerRole::kKey;
  if (contains(n, "v_proj.")) return LayerRole::kValue;
  if (contains(n, "o_proj.")) return LayerRole::kAttentionOutput;
  if (contains(n, "gate_proj.") || contains(n, ".w1.")) return LayerRole::kGate;
  if (contains(n, "up_proj.") || contains(n, ".w3.")) return LayerRole::kUp;
  if (contains(n, "down_proj.") || contains(n, ".w2.")) return LayerRole::kDown;
  return LayerRole::kOther;
}

StatusOr<std::vector<TpLayout>> layoutTensorParallel(const ModelConfig& c, const std::vector<ParameterInfo>& parameters,
                                                     int tp, const std::vector<TpLayerSpec>& specs) {
  if (tp < 1) return invalidArgument("deepspeed.tensor_parallel.autotp_size: must be at least 1, got {}", tp);
  return layoutTensorParallel(c, parameters, TensorParallelConfig{.size = tp, .layerSpecs = specs});
}

StatusOr<std::vector<TpLayout>> layoutTensorParallel(const ModelConfig& c, const std::vector<ParameterInfo>& parameters,
                                                     const TensorParallelConfig& config) {
  const int tp = config.ranks();
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
  const bool denseMlps = c.numMoeLayers() < c.numLayers;  // deepseek_v3's first layers, qwen*_moe's mlp_only_layers
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

  std::vector<CompiledSpec> patterns;
  for (size_t i = 0; i < config.layerSpecs.size(); ++i) {
    for (const auto& pattern : config.layerSpecs[i].patterns) {
      try {
        patterns.push_back({i, std::regex(pattern, std::regex::ECMAScript | std::regex::optimize)});
      } catch (const std::regex_error& e) {
        return invalidArgument("{}.patterns: \"{}\" is not a regex: {}", specPath(i), pattern, e.what());
      }
    }
  }

  // The split of each parameter, and the spec that chose it (-1: the default rule or none).
  std::vector<TpLayout> out(parameters.size());
  std::vector<int> chosenBy(parameters.size(), -1);
  bool vocabSplit = false;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ParameterInfo& p = parameters[i];
    const LayerRole role = layerRole(p);
    for (const auto& compiled : patterns) {
      if (std::regex_search(p.name, compiled.pattern, std::regex_constants::match_continuous)) {
        chosenBy[i] = static_cast<int>(compiled.spec);
        break;
      }
    }
    TpLayout& layout = out[i];
    if (chosenBy[i] >= 0) {
      const TpLayerSpec& spec = config.layerSpecs[chosenBy[i]];
      layout.split = spec.split;
      layout.gatherOutput = spec.gatherOutput;
      layout.gradAllreduce = spec.gradAllreduce;
    } else if (config.useDefaultSpecs && role != LayerRole::kOther) {
      layout.split = defaultSplit(role, p);
    } else {
      // A matrix that neither a layer spec nor the default rule covers stays whole; strict mode
      // says so instead (as DeepSpeed's strict_mode fails on an unmatched linear layer).
      if (config.strictMode && p.shape.size() == 2 && role != LayerRole::kEmbedding)
        return invalidArgument("deepspeed.tensor_parallel.partition_config.strict_mode: {} matches no layer_specs pattern{}",
                               p.name, config.useDefaultSpecs ? " and no default rule" : "");
      layout.split = TpSplit::kReplicated;
    }
    if (layout.split == TpSplit::kRow && p.shape.size() < 2) layout.split = TpSplit::kReplicated;
    vocabSplit |= layout.split == TpSplit::kVocab;
  }
  if (vocabSplit && c.vocabSize % tp != 0)
    return invalidArgument("tensor parallel {}: vocab_size {} is not a multiple of it (the embedding and head are "
                           "split by vocabulary)",
                           tp, c.vocabSize);

  for (size_t i = 0; i < parameters.size(); ++i) {
    const ParameterInfo& p = parameters[i];
    TpLayout& layout = out[i];
    layout.localShape = p.shape;
    if (layout.split == TpSplit::kReplicated) continue;
    const TpLayerSpec* spec = chosenBy[i] >= 0 ? &config.layerSpecs[chosenBy[i]] : nullptr;
    layout.splitDim = layout.split == TpSplit::kRow ? 1 : 0;
    if (spec && spec->partitionDim) {
      if (*spec->partitionDim >= static_cast<int>(p.shape.size()))
        return invalidArgument("{}.partition_dim: {} is out of range for {} ({} dimensions)", specPath(chosenBy[i]),
                               *spec->partitionDim, p.name, p.shape.size());
      layout.splitDim = *spec->partitionDim;
    }
    int64_t parts = tp;
    const LayerRole role = layerRole(p);
    if ((role == LayerRole::kKey || role == LayerRole::kValue) && layout.split == TpSplit::kColumn &&
        kvReplication > 1) {
      parts = c.numKvHeads;  // one KV head per rank, replicated
      layout.kvReplication = kvReplication;
    }
    const int dim = layout.splitDim;
    if (p.shape[dim] % parts != 0)
      return invalidArgument("{} {}: dimension {} of size {} does not split into {} parts", p.name,
                             tpSplitName(layout.split), dim, p.shape[dim], parts);
    if (spec && !spec->shape.empty()) RETURN_IF_ERROR(applyShape(*spec, chosenBy[i], p, parts, layout));
    layout.localShape[dim] = p.shape[dim] / parts;
  }
  if (tp == 1) {
    // One rank splits nothing: what the rules would split is whole.
    for (auto& layout : out) layout = TpLayout{.localShape = std::move(layout.localShape)};
  }
  return out;
}

}  // namespace loom::planner
