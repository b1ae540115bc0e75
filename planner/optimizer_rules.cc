#include "planner/optimizer_rules.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "planner/model_parameters.h"
#include "planner/plan.h"

namespace loom::planner {
namespace {

const OptimizerRule kAdam{"AdamW", false, {"exp_avg", "exp_avg_sq"}};
const OptimizerRule kLion{"Lion", false, {"exp_avg"}};
const OptimizerRule kAdagrad{"Adagrad", false, {"sum"}};
const OptimizerRule kMuon{"Muon", true, {"momentum_buffer"}};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

const OptimizerRule& optimizerRule(const OptimizerConfig& optimizer, bool muonMatrix) {
  switch (optimizer.type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: return kAdam;
    case OptimizerType::kLion: return kLion;
    case OptimizerType::kAdagrad: return kAdagrad;
    case OptimizerType::kMuon: return muonMatrix ? kMuon : kAdam;
  }
  return kAdam;
}

bool isMuonMatrix(const std::string& name, const std::vector<int64_t>& shape) {
  const std::string n = lower(name);
  return shape.size() >= 2 && n.find("embed") == std::string::npos && n.find("lm_head") == std::string::npos;
}

double optimizerStatesPerElement(const OptimizerConfig& optimizer, const std::vector<ParameterInfo>& parameters) {
  double states = 0, elements = 0;
  for (const ParameterInfo& p : parameters) {
    if (!p.trainable) continue;
    const bool muon = optimizer.type == OptimizerType::kMuon && isMuonMatrix(p.name, p.shape);
    states += static_cast<double>(p.numel()) * static_cast<double>(optimizerRule(optimizer, muon).stateNames.size());
    elements += static_cast<double>(p.numel());
  }
  return elements > 0 ? states / elements
                      : static_cast<double>(optimizerRule(optimizer, false).stateNames.size());
}

int64_t attentionHeadWidth(const ModelConfig& c, const ParameterSpec& p) {
  if (p.shape.size() != 2) return 0;
  std::vector<std::pair<int64_t, int64_t>> candidates;  // (heads, width)
  const int64_t kvHeads = c.numKvHeads > 0 ? c.numKvHeads : c.numHeads;
  switch (p.role) {
    case LayerRole::kQuery:
      // Under latent attention q_proj (no q_lora_rank) or q_b_proj: nope + rope per head; the
      // shape says which of the widths a config carrying both fields means.
      if (c.isMla()) candidates.emplace_back(c.numHeads, c.mla.qkHeadDim());
      candidates.emplace_back(c.numHeads, c.headDim);
      break;
    case LayerRole::kKey:
    case LayerRole::kValue: candidates.emplace_back(kvHeads, c.headDim); break;
    case LayerRole::kKeyValue: candidates.emplace_back(c.numHeads, c.mla.qkNopeHeadDim + c.mla.vHeadDim); break;
    default: return 0;  // the output projection, the latents and the MLP are not blocked by heads on dim 0
  }
  for (const auto& [heads, width] : candidates) {
    if (heads > 0 && width > 0 && p.shape[0] == heads * width) return width;
  }
  return 0;
}

Status tagMuonParameters(const OptimizerConfig& optimizer, const ModelConfig& model,
                         std::vector<ParameterSpec>& parameters) {
  if (optimizer.type != OptimizerType::kMuon) return Status::ok();
  std::vector<std::string> acrossHeads;
  int tagged = 0;
  for (ParameterSpec& p : parameters) {
    p.muon = p.trainable && !p.frozen && isMuonMatrix(p.name, p.shape);
    p.muonHeadDim = 0;
    if (!p.muon || !optimizer.muon.perHead) continue;
    const int64_t width = attentionHeadWidth(model, p);
    if (width == 0) continue;
    const int64_t rows = p.localShape.empty() ? p.shape[0] : p.localShape[0];
    if (rows % width != 0) {
      acrossHeads.push_back(fmt::format("{} ({} rows on a rank, heads of {})", p.name, rows, width));
      continue;
    }
    p.muonHeadDim = width;
    ++tagged;
  }
  if (optimizer.muon.perHead && tagged == 0) {
    if (!acrossHeads.empty())
      return invalidArgument("deepspeed.optimizer.params.per_head_muon: every attention projection is split across its "
                             "heads by tensor parallelism, so per-head Newton-Schulz would run for none of them ({}); "
                             "unset per_head_muon to train without it",
                             fmt::join(acrossHeads, ", "));
    return invalidArgument("deepspeed.optimizer.params.per_head_muon: the {} model has no trainable attention projection "
                           "(q_proj, k_proj, v_proj, q_b_proj, kv_b_proj whose rows are heads x head_dim) to "
                           "orthogonalize head by head; unset per_head_muon to train without it",
                           modelFamilyName(model.family));
  }
  return Status::ok();
}

}  // namespace loom::planner
