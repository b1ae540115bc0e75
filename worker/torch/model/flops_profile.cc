#include "worker/torch/model/flops_profile.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>

#include <ATen/ATen.h>
#include <fmt/format.h>

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

// Python's repr of a float, as torch prints eps: 1e-06, 1e-05, 0.001.
std::string pythonFloat(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// Python's `round(x, 2)` then `:g`.
std::string roundedG(double v) {
  const double r = std::nearbyint(v * 100.0) / 100.0;
  return fmt::format("{:g}", r == 0 ? 0.0 : r);
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

FlopsProfile::Scope::Scope(FlopsProfile* profile, const std::string& path) {
  if (profile) enter(profile, path);
}

FlopsProfile::Scope::Scope(FlopsProfile* profile, int64_t layer, const char* leaf) {
  if (profile) enter(profile, fmt::format("model.layers.{}{}{}", layer, *leaf ? "." : "", leaf));
}

void FlopsProfile::Scope::enter(FlopsProfile* profile, const std::string& path) {
  const int module = profile->find(path);
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
  Scope scope(this, pathOf(target));
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

// ---- the report -------------------------------------------------------------------------------

std::string profilerNumber(double num) {
  double magnitude = 1;
  const char* units = "";
  if (num >= 1e12) {
    magnitude = 1e12, units = "T";
  } else if (num >= 1e9) {
    magnitude = 1e9, units = "G";
  } else if (num >= 1e6) {
    magnitude = 1e6, units = "M";
  } else if (num >= 1e3) {
    magnitude = 1e3, units = "K";
  } else if (num >= 1 || num == 0) {
    magnitude = 1, units = "";
  } else if (num >= 1e-3) {
    magnitude = 1e-3, units = "m";
  } else {
    magnitude = 1e-6, units = "u";
  }
  return roundedG(num / magnitude) + " " + units;
}

std::string profilerParams(double params) {
  std::string s = profilerNumber(params);
  std::replace(s.begin(), s.end(), 'G', 'B');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

namespace {

std::string macsString(double macs) { return profilerNumber(macs) + "MACs"; }
std::string flopsString(double flops) { return profilerNumber(flops) + "FLOPS"; }
std::string durationString(double seconds) { return profilerNumber(seconds) + "s"; }
std::string percent(double part, double whole) { return whole ? roundedG(100 * part / whole) : "0"; }

// DeepSpeed's '{:<70}  {:<8}'.
std::string summaryLine(const std::string& label, const std::string& value) {
  return fmt::format("{:<70}  {:<8}\n", label, value);
}

// torch's Module.__repr__ with DeepSpeed's flops_repr as every module's extra_repr; a ModuleList
// folds runs of identical children into "(0-1): 2 x ...".
class TreePrinter {
 public:
  explicit TreePrinter(const FlopsProfile& p) : p_(p) {
    totalParams_ = static_cast<double>(p.modules()[0].params);
    totalMacs_ = static_cast<double>(p.totalMacs(0));
    totalSeconds_ = p.totalSeconds(0);
  }

  std::string repr(int index) const {
    const auto& m = p_.modules()[index];
    std::vector<std::string> children;
    if (m.className == "ModuleList") {
      const auto& kids = m.children;
      for (size_t i = 0; i < kids.size();) {
        const std::string body = repr(kids[i]);
        size_t j = i + 1;
        while (j < kids.size() && repr(kids[j]) == body) ++j;
        const std::string key = j - i == 1 ? "(" + p_.modules()[kids[i]].name + ")"
                                           : fmt::format("({}-{}): {} x", p_.modules()[kids[i]].name,
                                                         p_.modules()[kids[j - 1]].name, j - i);
        children.push_back(j - i == 1 ? key + ": " + indent(body) : key + " " + indent(body));
        i = j;
      }
      if (children.empty()) return m.className + "()";
      std::string out = m.className + "(\n";
      for (const auto& c : children) out += "  " + c + "\n";
      return out + ")";
    }
    for (int c : m.children) children.push_back("(" + p_.modules()[c].name + "): " + indent(repr(c)));
    const std::string extra = profileRepr(index);
    if (children.empty()) return m.className + "(" + extra + ")";
    std::string out = m.className + "(\n  " + indent(extra) + "\n";
    for (const auto& c : children) out += "  " + c + "\n";
    return out + ")";
  }

 private:
  std::string profileRepr(int index) const {
    const auto& m = p_.modules()[index];
    const double params = static_cast<double>(m.params), macs = static_cast<double>(p_.totalMacs(index));
    const double seconds = p_.totalSeconds(index), flops = static_cast<double>(p_.totalFlops(index));
    const double rate = seconds ? std::nearbyint(flops / seconds * 100) / 100 : 0;
    std::string out = fmt::format("{} = {}% Params, {} = {}% MACs, {} = {}% latency, {}", profilerParams(params),
                                  percent(params, totalParams_), macsString(macs), percent(macs, totalMacs_),
                                  durationString(seconds), percent(seconds, totalSeconds_), flopsString(rate));
    if (!m.extraRepr.empty()) out += ", " + m.extraRepr;
    return out;
  }

  // torch's _addindent(s, 2): every line but the first, two spaces in.
  static std::string indent(const std::string& s) {
    std::string out;
    for (char ch : s) {
      out += ch;
      if (ch == '\n') out += "  ";
    }
    return out;
  }

  const FlopsProfile& p_;
  double totalParams_ = 0, totalMacs_ = 0, totalSeconds_ = 0;
};

// A Python dict's repr of the top entries: {'LlamaMLP': '49.15 K', 'LlamaAttention': '24.58 K'}.
std::string topEntries(std::vector<std::pair<std::string, double>> entries, int top,
                       std::string (*format)(double)) {
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out = "{";
  for (int i = 0; i < std::min<int>(top, static_cast<int>(entries.size())); ++i)
    out += fmt::format("{}'{}': '{}'", i ? ", " : "", entries[i].first, format(entries[i].second));
  return out + "}";
}

std::string aggregated(const FlopsProfile& p, int moduleDepth, int topModules) {
  // depth -> class name -> (macs, params, seconds), classes in the order they are met
  std::vector<std::vector<std::pair<std::string, std::array<double, 3>>>> info;
  std::function<void(int, size_t)> walk = [&](int index, size_t depth) {
    if (info.size() <= depth) info.resize(depth + 1);
    const auto& m = p.modules()[index];
    auto& level = info[depth];
    auto it = std::find_if(level.begin(), level.end(), [&](const auto& e) { return e.first == m.className; });
    if (it == level.end()) it = level.insert(level.end(), {m.className, {0, 0, 0}});
    it->second[0] += static_cast<double>(p.totalMacs(index));
    it->second[1] += static_cast<double>(m.params);
    it->second[2] += p.totalSeconds(index);
    for (int c : m.children) walk(c, depth + 1);
  };
  walk(0, 0);
  const int depth = moduleDepth == -1 ? static_cast<int>(info.size()) - 1 : moduleDepth;
  std::string out = fmt::format("Top {} modules in terms of params, MACs or fwd latency at different model depths:\n",
                                topModules);
  for (int d = 0; d < depth && d < static_cast<int>(info.size()); ++d) {
    auto column = [&](int k) {
      std::vector<std::pair<std::string, double>> entries;
      for (const auto& [name, values] : info[d]) entries.emplace_back(name, values[k]);
      return entries;
    };
    out += fmt::format("depth {}:\n", d);
    out += "    params      - " + topEntries(column(1), topModules, profilerParams) + "\n";
    out += "    MACs        - " + topEntries(column(0), topModules, macsString) + "\n";
    out += "    fwd latency - " + topEntries(column(2), topModules, durationString) + "\n";
  }
  return out;
}

// Python's repr of round(x, 2): 290.45, 12.0.
std::string pythonRounded(double v) { return pythonFloat(std::nearbyint(v * 100) / 100); }

}  // namespace

std::string flopsProfileReport(const FlopsProfile& profile, const FlopsReportContext& c) {
  const double params = static_cast<double>(profile.modules()[0].params);
  const double macs = static_cast<double>(profile.totalMacs(0)), flops = static_cast<double>(profile.totalFlops(0));
  std::string out = "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n";
  out += fmt::format("Profile Summary at step {}:\n", c.profileStep);
  out += "Notations:\n"
         "data parallel size (dp_size), model parallel size(mp_size),\n"
         "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
         "number of floating-point operations (flops), floating-point operations per second (FLOPS),\n"
         "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
         "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  out += summaryLine("world size: ", std::to_string(c.worldSize));
  out += summaryLine("data parallel size: ", std::to_string(c.dataParallelSize));
  out += summaryLine("model parallel size: ", std::to_string(c.modelParallelSize));
  out += summaryLine("batch size per GPU: ", std::to_string(c.microBatchSize));
  out += summaryLine("params per GPU: ", profilerParams(params));
  out += summaryLine("params of model = params per GPU * mp_size: ", profilerParams(params * c.modelParallelSize));
  out += summaryLine("fwd MACs per GPU: ", macsString(macs));
  out += summaryLine("fwd flops per GPU: ", profilerNumber(flops));
  out += summaryLine("fwd flops of model = fwd flops per GPU * mp_size: ", profilerNumber(flops * c.modelParallelSize));
  // With the profiler on, DeepSpeed's engine times every step: the forward, backward and step
  // latencies are its global timers'.
  const double fwd = c.forwardSeconds, bwd = c.backwardSeconds, step = c.stepSeconds;
  out += summaryLine("fwd latency: ", durationString(fwd));
  out += summaryLine("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", flopsString(fwd ? flops / fwd : 0));
  const double factor = 2 + c.recomputeFwdFactor;
  out += summaryLine("bwd latency: ", durationString(bwd));
  out += summaryLine(fmt::format("bwd FLOPS per GPU = {:g} * fwd flops per GPU / bwd latency: ", factor),
                     flopsString(bwd ? factor * flops / bwd : 0));
  out += summaryLine(fmt::format("fwd+bwd FLOPS per GPU = {:g} * fwd flops per GPU / (fwd+bwd latency): ", factor + 1),
                     flopsString(fwd + bwd ? (factor + 1) * flops / (fwd + bwd) : 0));
  out += summaryLine("step latency: ", durationString(step));
  const double iter = fwd + bwd + step;
  out += summaryLine("iter latency: ", durationString(iter));
  out += summaryLine(fmt::format("FLOPS per GPU = {:g} * fwd flops per GPU / iter latency: ", factor + 1),
                     flopsString(iter ? (factor + 1) * flops / iter : 0));
  out += summaryLine("samples/second: ",
                     pythonRounded(iter ? static_cast<double>(c.microBatchSize * c.worldSize) / iter : 0));
  out += "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
  out += aggregated(profile, c.moduleDepth, c.topModules);
  if (c.detailed) {
    out += "\n------------------------------ Detailed Profile per GPU ------------------------------\n";
    out += "Each module profile is listed after its name in the following order: \n"
           "params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd "
           "latency, fwd FLOPS\n";
    out += "\nNote: 1. A module can have torch.nn.module or torch.nn.functional to compute logits (e.g. "
           "CrossEntropyLoss). They are not counted as submodules, thus not to be printed out. However they make up "
           "the difference between a parent's MACs (or latency) and the sum of its submodules'.\n"
           "2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed using that could "
           "be larger than the maximum system throughput.\n"
           "3. The fwd latency listed in the top module's profile is directly captured at the module forward "
           "function in PyTorch, thus it's less than the fwd latency shown above which is captured in DeepSpeed.\n\n";
    out += TreePrinter(profile).repr(0) + "\n";
  }
  out += "------------------------------------------------------------------------------\n";
  return out;
}

}  // namespace loom::worker
