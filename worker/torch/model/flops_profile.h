#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "planner/model_config.h"

namespace loom::worker {

// DeepSpeed's flops profiler (deepspeed/profiling/flops_profiler) over Loom's decoder. DeepSpeed
// hooks every module of the Hugging Face model and counts the operations it patches as they run;
// Loom's decoder is not made of modules, so the profile holds the HF module tree of the model's
// family (names, classes and order as transformers 5 registers them) and the forward marks where
// each module begins and ends (Scope) and what it computes (linear, count*). The
// counts are DeepSpeed's rules for the ops HF runs there: F.linear input.numel() x out_features
// MACs, scaled_dot_product_attention q x k + q x v, silu and softmax one flop per element, the
// rotary embedding's inv_freq x positions matmul; norms, embeddings and elementwise operators
// count nothing. One difference: transformers 5 runs a MoE layer's experts as one fused module
// whose grouped matmuls DeepSpeed does not patch (it counts 0 MACs there); Loom counts the routed
// tokens' F.linear MACs.
class FlopsProfile {
 public:
  struct Module {
    std::string name;       // its attribute in the parent: "q_proj", "0"
    std::string className;  // "Linear", "LlamaAttention"
    std::string extraRepr;  // what torch's repr prints in the parentheses: "in_features=64, ..."
    int parent = -1;
    std::vector<int> children;
    std::vector<int> parameters;  // indices into the model's parameters, this module's and below
    int64_t params = 0;           // their elements (trainable ones), counted once each
    // Measured (this module's own operations, not its children's):
    int64_t macs = 0, flops = 0;
    double seconds = 0;  // inclusive, as DeepSpeed's pre- and post-forward hooks time it
  };

  // The HF tree of the model's family over `parameters` (the model's, in HF names and this rank's
  // shapes; frozen ones count no parameters, as DeepSpeed counts requires_grad ones only).
  FlopsProfile(const planner::ModelConfig& config, const std::vector<std::pair<std::string, at::Tensor>>& parameters,
               at::Device device);

  // Times one module's forward (the device synchronized at both ends, as DeepSpeed's hooks do):
  // from construction to destruction. Inert for a null profile, so the forward can always make one.
  class Scope {
   public:
    // A literal path: nothing is made when there is no profile (this runs on every forward).
    Scope(FlopsProfile* profile, const char* path);
    // "model.layers.<layer>.<leaf>" (layer 0-based), the path made only when profiling.
    Scope(FlopsProfile* profile, int64_t layer, const char* leaf);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    friend class FlopsProfile;
    Scope(FlopsProfile* profile, int module);  // a module by its index (-1: inert)
    void enter(FlopsProfile* profile, int module);
    FlopsProfile* profile_ = nullptr;
    int module_ = -1;
    std::chrono::steady_clock::time_point start_;
  };

  // Opens or closes a module whose forward spans calls (HF's `model`: embedding to final norm).
  void open(const std::string& path);
  void close(const std::string& path);

  // An F.linear of `input` by `weight` [out, in]: counted into the innermost open module when it
  // is a Linear, else into (and timed as) the Linear whose parameter `weight` is, else into the
  // module owning that parameter (a fused experts module), else the innermost open one.
  using LinearFn = at::Tensor (*)(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
  at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias, LinearFn run);
  // While a profile is installed on this thread, profiledLinear is a LinearFn that counts each
  // call into it and runs `run`: the model's linear layers (experts' and latent attention's too)
  // are counted wherever they are called from.
  static void install(FlopsProfile* profile, LinearFn run);
  static at::Tensor profiledLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
  // Into the innermost open module (or the one at `path`): F.scaled_dot_product_attention of q
  // [B, H, L, Dqk] over k [B, Hk, S, Dqk] and v [B, Hk, S, Dv]; an elementwise op of `elements`
  // (silu, softmax); a matmul's MACs.
  void countAttention(int64_t batch, int64_t heads, int64_t queries, int64_t keys, int64_t qkDim, int64_t vDim);
  void countElementwise(int64_t elements, const std::string& path = "");
  void countMacs(int64_t macs, const std::string& path = "");

  const std::vector<Module>& modules() const { return modules_; }
  int find(const std::string& path) const;
  // Recursive totals, as DeepSpeed's get_module_macs / _flops / _duration (a module timed at 0,
  // such as a ModuleList, takes its children's time).
  int64_t totalMacs(int module) const;
  int64_t totalFlops(int module) const;
  double totalSeconds(int module) const;

 private:
  int add(int parent, std::string name, std::string className, std::string extraRepr = "");
  void build(const planner::ModelConfig& config, const std::vector<std::pair<std::string, at::Tensor>>& parameters);
  int innermost() const { return stack_.empty() ? 0 : stack_.back(); }
  std::string pathOf(int module) const;

  at::Device device_;
  std::vector<Module> modules_;  // 0: the root (XForCausalLM)
  std::unordered_map<std::string, int> byPath_;
  std::unordered_map<const void*, int> byTensor_;   // a parameter's TensorImpl -> its module
  std::unordered_map<const void*, int> byStorage_;  // its storage (a slice of a fused expert weight)
  std::vector<int> stack_;                           // the open modules
  std::vector<std::chrono::steady_clock::time_point> opened_;  // open()'s start times, by stack_ position
};

}  // namespace loom::worker
