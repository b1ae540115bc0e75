#include "worker/torch/model/flops_profile.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "worker/monitor/monitor_event.h"  // pythonFloat
#include "worker/torch/model/model_setup.h"

namespace loom::worker {

namespace {

using Clock = std::chrono::steady_clock;

// transformers' class-name prefix of each family.
std::string prefixOf(planner::ModelFamily family) {
  switch (family) {
    case planner::ModelFamily::kLlama: return "Llama";
    case planner::ModelFamily::kMistral: return "Mistral";
    case planner::ModelFamily::kQwen2: return "Qwen2";
    case planner::ModelFamily::kQwen3: return "Qwen3";
    case planner::ModelFamily::kMixtral: return "Mixtral";
    case planner::ModelFamily::kQwen2Moe: return "Qwen2Moe";
    case planner::ModelFamily::kQwen3Moe: return "Qwen3Moe";
    case planner::ModelFamily::kDeepseekV3: return "DeepseekV3";
  }
  return "Llama";
}

}  // namespace

// ---- the tree ---------------------------------------------------------------------------------

FlopsProfile::FlopsProfile(const planner::ModelConfig& config,
                           const std::vector<std::pair<std::string, at::Tensor>>& parameters, at::Device device)
    : device_(device) {
  build(config, parameters);
}

int FlopsProfile::add(int parent, std::string name, std::string className, std::string extraRepr) {
  const int index = static_cast<int>(modules_.size());
  modules_.push_back(Module{.name = std::move(name), .className = std::move(className),
                            .extraRepr = std::move(extraRepr), .parent = parent});
  if (parent >= 0) modules_[parent].children.push_back(index);
  byPath_[pathOf(index)] = index;
  return index;
}

std::string FlopsProfile::pathOf(int module) const {
  std::string path;
  for (int m = module; m > 0; m = modules_[m].parent) path = modules_[m].name + (path.empty() ? "" : "." + path);
  return path;
}

int FlopsProfile::find(const std::string& path) const {
  auto it = byPath_.find(path);
  return it == byPath_.end() ? -1 : it->second;
}

void FlopsProfile::build(const planner::ModelConfig& c,
                         const std::vector<std::pair<std::string, at::Tensor>>& parameters) {
  const std::string p = prefixOf(c.family);
  std::map<std::string, at::Tensor> byName(parameters.begin(), parameters.end());
  auto shape = [&](const std::string& name) -> std::vector<int64_t> {
    auto it = byName.find(name);
    return it == byName.end() ? std::vector<int64_t>{} : it->second.sizes().vec();
  };
  auto linear = [&](int parent, const std::string& name, const std::string& path, int64_t in, int64_t out) {
    const auto w = shape(path + ".weight");
    if (w.size() == 2) out = w[0], in = w[1];  // this rank's shard under tensor parallelism
    add(parent, name, "Linear",
        fmt::format("in_features={}, out_features={}, bias={}", in, out, byName.count(path + ".bias") ? "True" : "False"));
  };
  auto norm = [&](int parent, const std::string& name, const std::string& path, int64_t size) {
    const auto w = shape(path + ".weight");
    add(parent, name, p + "RMSNorm", fmt::format("({},), eps={}", w.empty() ? size : w[0], pythonFloat(c.rmsNormEps)));
  };
  auto mlp = [&](int parent, const std::string& name, const std::string& path, const std::string& cls, int64_t inner) {
    const int m = add(parent, name, cls);
    linear(m, "gate_proj", path + ".gate_proj", c.hiddenSize, inner);
    linear(m, "up_proj", path + ".up_proj", c.hiddenSize, inner);
    linear(m, "down_proj", path + ".down_proj", inner, c.hiddenSize);
    add(m, "act_fn", "SiLUActivation");
  };

  const int root = add(-1, "", p + "ForCausalLM");
  const int model = add(root, "model", p + "Model");
  const auto embed = shape("model.embed_tokens.weight");
  add(model, "embed_tokens", "Embedding",
      fmt::format("{}, {}", embed.empty() ? c.vocabSize : embed[0], embed.empty() ? c.hiddenSize : embed[1]));
  const int layers = add(model, "layers", "ModuleList");
  const int64_t heads = c.numHeads, kvHeads = c.numKvHeads, d = c.headDim;
  for (int64_t i = 0; i < c.numLayers; ++i) {
    const std::string lp = fmt::format("model.layers.{}", i);
    const int layer = add(layers, std::to_string(i), p + "DecoderLayer");
    const int attn = add(layer, "self_attn", p + "Attention");
    const std::string ap = lp + ".self_attn";
    if (c.isMla()) {
      const auto& m = c.mla;
      if (m.qLoraRank > 0) {
        linear(attn, "q_a_proj", ap + ".q_a_proj", c.hiddenSize, m.qLoraRank);
        norm(attn, "q_a_layernorm", ap + ".q_a_layernorm", m.qLoraRank);
        linear(attn, "q_b_proj", ap + ".q_b_proj", m.qLoraRank, heads * m.qkHeadDim());
      } else {
        linear(attn, "q_proj", ap + ".q_proj", c.hiddenSize, heads * m.qkHeadDim());
      }
      linear(attn, "kv_a_proj_with_mqa", ap + ".kv_a_proj_with_mqa", c.hiddenSize, m.kvLoraRank + m.qkRopeHeadDim);
      norm(attn, "kv_a_layernorm", ap + ".kv_a_layernorm", m.kvLoraRank);
      linear(attn, "kv_b_proj", ap + ".kv_b_proj", m.kvLoraRank, heads * (m.qkNopeHeadDim + m.vHeadDim));
      linear(attn, "o_proj", ap + ".o_proj", heads * m.vHeadDim, c.hiddenSize);
    } else {
      linear(attn, "q_proj", ap + ".q_proj", c.hiddenSize, heads * d);
      linear(attn, "k_proj", ap + ".k_proj", c.hiddenSize, kvHeads * d);
      linear(attn, "v_proj", ap + ".v_proj", c.hiddenSize, kvHeads * d);
      linear(attn, "o_proj", ap + ".o_proj", heads * d, c.hiddenSize);
      if (c.qkNorm) {
        norm(attn, "q_norm", ap + ".q_norm", d);
        norm(attn, "k_norm", ap + ".k_norm", d);
      }
    }
    const std::string mp = lp + ".mlp";
    if (!c.isMoeLayer(i)) {
      mlp(layer, "mlp", mp, p + "MLP", c.intermediateSize);
    } else {
      const bool deepseek = c.family == planner::ModelFamily::kDeepseekV3;
      const int moe = add(layer, "mlp", deepseek ? p + "MoE" : p + "SparseMoeBlock");
      auto experts = [&] { add(add(moe, "experts", p + "Experts"), "act_fn", "SiLUActivation"); };
      auto gate = [&] { add(moe, "gate", p + (deepseek ? "TopkRouter" : "TopKRouter")); };
      if (c.family == planner::ModelFamily::kMixtral || c.family == planner::ModelFamily::kQwen2Moe) {
        gate();
        experts();
      } else {
        experts();
        gate();
      }
      if (c.family == planner::ModelFamily::kQwen2Moe) {
        mlp(moe, "shared_expert", mp + ".shared_expert", p + "MLP", c.sharedExpertIntermediateSize);
        linear(moe, "shared_expert_gate", mp + ".shared_expert_gate", c.hiddenSize, 1);
      } else if (deepseek && c.sharedExpertIntermediateSize > 0) {
        mlp(moe, "shared_experts", mp + ".shared_experts", p + "MLP", c.sharedExpertIntermediateSize);
      }
    }
    norm(layer, "input_layernorm", lp + ".input_layernorm", c.hiddenSize);
    norm(layer, "post_attention_layernorm", lp + ".post_attention_layernorm", c.hiddenSize);
  }
  norm(model, "norm", "model.norm", c.hiddenSize);
  add(model, "rotary_emb", p + "RotaryEmbedding");
  const bool tied = !byName.count("lm_head.weight");
  const auto head = shape(tied ? "model.embed_tokens.weight" : "lm_head.weight");
  add(root, "lm_head", "Linear",
      fmt::format("in_features={}, out_features={}, bias=False", head.empty() ? c.hiddenSize : head[1],
                  head.empty() ? c.vocabSize : head[0]));

  // Each parameter belongs to the module its name leads to (or the nearest one the tree has), and
  // counts in that module and every module above it. A tied lm_head holds the embedding's weight
  // too; the root counts it once.
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& [name, tensor] = parameters[i];
    std::string path = name.substr(0, name.rfind('.'));
    // Mixtral's checkpoints keep transformers 4's `block_sparse_moe` (and experts.N.w1); the
    // module transformers 5 builds from them is `mlp` (and one fused `experts`).
    if (auto at = path.find(".block_sparse_moe"); at != std::string::npos)
      path.replace(at, std::string(".block_sparse_moe").size(), ".mlp");
    int owner = find(path);
    while (owner < 0 && path.find('.') != std::string::npos) owner = find(path = path.substr(0, path.rfind('.')));
    if (owner < 0) owner = 0;
    byTensor_[tensor.unsafeGetTensorImpl()] = owner;
    if (tensor.has_storage()) byStorage_[tensor.storage().data()] = owner;
    std::vector<int> holders{owner};
    if (tied && name == "model.embed_tokens.weight") holders.push_back(find("lm_head"));
    for (int h : holders)
      for (int m = h; m >= 0; m = modules_[m].parent) modules_[m].parameters.push_back(static_cast<int>(i));
  }
  for (auto& m : modules_) {
    std::sort(m.parameters.begin(), m.parameters.end());
    m.parameters.erase(std::unique(m.parameters.begin(), m.parameters.end()), m.parameters.end());
    for (int i : m.parameters)
      if (parameters[i].second.requires_grad()) m.params += parameters[i].second.numel();
  }
}

// ---- recording --------------------------------------------------------------------------------

FlopsProfile::Scope::Scope(FlopsProfile* profile, const char* path) {
  if (profile) enter(profile, profile->find(path));
}

FlopsProfile::Scope::Scope(FlopsProfile* profile, int64_t layer, const char* leaf) {
  if (profile) enter(profile, profile->find(fmt::format("model.layers.{}{}{}", layer, *leaf ? "." : "", leaf)));
}

FlopsProfile::Scope::Scope(FlopsProfile* profile, int module) {
  if (profile) enter(profile, module);
}

void FlopsProfile::Scope::enter(FlopsProfile* profile, int module) {
  // A module already open (the root, entered by loss() and again by logits()) is timed once.
  if (module < 0 || std::count(profile->stack_.begin(), profile->stack_.end(), module)) return;
  profile_ = profile;
  module_ = module;
  synchronize(profile->device_);
  profile->stack_.push_back(module);
  start_ = Clock::now();
}

FlopsProfile::Scope::~Scope() {
  if (!profile_) return;
  synchronize(profile_->device_);
  profile_->modules_[module_].seconds += std::chrono::duration<double>(Clock::now() - start_).count();
  profile_->stack_.pop_back();
}

void FlopsProfile::open(const std::string& path) {
  const int module = find(path);
  if (module < 0) return;
  synchronize(device_);
  stack_.push_back(module);
  opened_.resize(stack_.size());
  opened_.back() = Clock::now();
}

void FlopsProfile::close(const std::string& path) {
  const int module = find(path);
  if (module < 0 || stack_.empty() || stack_.back() != module) return;
  synchronize(device_);
  modules_[module].seconds += std::chrono::duration<double>(Clock::now() - opened_[stack_.size() - 1]).count();
  stack_.pop_back();
}

namespace {
thread_local FlopsProfile* installedProfile = nullptr;
thread_local FlopsProfile::LinearFn installedRun = nullptr;
}  // namespace

void FlopsProfile::install(FlopsProfile* profile, LinearFn run) {
  installedProfile = profile;
  installedRun = run;
}

at::Tensor FlopsProfile::profiledLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return installedProfile ? installedProfile->linear(x, weight, bias, installedRun) : installedRun(x, weight, bias);
}

at::Tensor FlopsProfile::linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                LinearFn run) {
  const int64_t macs = input.numel() * weight.size(0);
  int target = innermost();
  bool timed = false;
  if (modules_[target].className != "Linear") {
    int owner = -1;
    if (auto it = byTensor_.find(weight.unsafeGetTensorImpl()); it != byTensor_.end()) {
      owner = it->second;
    } else if (weight.has_storage()) {
      if (auto st = byStorage_.find(weight.storage().data()); st != byStorage_.end()) owner = st->second;
    }
    if (owner >= 0) {
      target = owner;
      timed = modules_[target].className == "Linear";
    }
  }
  modules_[target].macs += macs;
  modules_[target].flops += 2 * macs;
  if (!timed) return run(input, weight, bias);
  Scope scope(this, target);
  return run(input, weight, bias);
}

void FlopsProfile::countAttention(int64_t batch, int64_t heads, int64_t queries, int64_t keys, int64_t qkDim,
                                  int64_t vDim) {
  const int64_t macs = batch * heads * queries * keys * (qkDim + vDim);
  modules_[innermost()].macs += macs;
  modules_[innermost()].flops += 2 * macs;
}

void FlopsProfile::countElementwise(int64_t elements, const std::string& path) {
  const int m = path.empty() ? innermost() : find(path);
  if (m >= 0) modules_[m].flops += elements;
}

void FlopsProfile::countMacs(int64_t macs, const std::string& path) {
  const int m = path.empty() ? innermost() : find(path);
  if (m < 0) return;
  modules_[m].macs += macs;
  modules_[m].flops += 2 * macs;
}

int64_t FlopsProfile::totalMacs(int module) const {
  int64_t total = modules_[module].macs;
  for (int c : modules_[module].children) total += totalMacs(c);
  return total;
}

int64_t FlopsProfile::totalFlops(int module) const {
  int64_t total = modules_[module].flops;
  for (int c : modules_[module].children) total += totalFlops(c);
  return total;
}

double FlopsProfile::totalSeconds(int module) const {
  double seconds = modules_[module].seconds;
  if (seconds == 0)
    for (int c : modules_[module].children) seconds += totalSeconds(c);
  return seconds;
}

}  // namespace loom::worker
