// Plan compilation time: the planner compiles a job's Plan on every CreateJob, so it must stay
// well under a second for the largest jobs. Compiles, repeatedly:
//   1. Llama-3-70B on 1,024 ranks, tp 8, ZeRO 3 (the goal: under one second),
//   2. DeepSeek-V3 on 1,024 ranks, ep 64, ZeRO 3 (45,395 tensors: the largest plan Loom knows),
// and times the conversion to loom.v1.Plan and its serialization (what the planner stores).
// Usage: loom-bench-planner [--repeats 10]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "planner/job_spec.h"
#include "planner/model_config.h"
#include "planner/plan_compiler.h"
#include "proto/convert.h"

namespace {

using Clock = std::chrono::steady_clock;

// config.json of meta-llama/Meta-Llama-3-70B, the fields that decide the parameters.
constexpr const char* kLlama3_70b = R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 8192,
  "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
  "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": false})";

// config.json of deepseek-ai/DeepSeek-V3, likewise.
constexpr const char* kDeepseekV3 = R"({"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
  "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "first_k_dense_replace": 3,
  "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
  "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "norm_topk_prob": true,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
  "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
    "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})";

std::string trainSpec(int ranks, const std::string& parallel, double deviceGb) {
  return fmt::format(R"({{"name": "bench", "kind": "train",
    "resources": {{"ranks": {}, "device": "cuda", "device_memory_gb": {}}},
    "model": {{"config": "/models/config.json"}}, "data": {{"train": "/data/train.tokens", "seq_len": 4096}},
    "train": {{"steps": 1000}},
    "deepspeed": {{"train_micro_batch_size_per_gpu": 1, "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4}}}},
      "bf16": {{"enabled": true}}, "zero_optimization": {{"stage": 3}}, {}}}}})",
                     ranks, deviceGb, parallel);
}

double msBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const char* label, const char* configJson, const std::string& specJson, int repeats) {
  auto model = loom::planner::parseModelConfig(configJson);
  auto spec = loom::planner::parseJobSpec(specJson, loom::planner::SpecPurpose::kPlan);
  if (!model.isOk() || !spec.isOk()) {
    std::fprintf(stderr, "%s: %s%s\n", label, model.status().toString().c_str(), spec.status().toString().c_str());
    return 1;
  }
  std::vector<double> compile, convert;
  size_t bytes = 0, tensors = 0;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    auto plan = loom::planner::compilePlan(*model, *spec);
    const auto t1 = Clock::now();
    if (!plan.isOk()) {
      std::fprintf(stderr, "%s: %s\n", label, plan.status().toString().c_str());
      return 1;
    }
    bytes = loom::convert::toProto(*plan).SerializeAsString().size();
    const auto t2 = Clock::now();
    compile.push_back(msBetween(t0, t1));
    convert.push_back(msBetween(t1, t2));
    tensors = plan->parameters.size();
  }
  std::printf("%-44s %7zu tensors  compile %8.1f ms (min %8.1f)  to proto + serialize %7.1f ms  %6.1f MiB\n",
              label, tensors, median(compile), *std::min_element(compile.begin(), compile.end()), median(convert),
              bytes / 1048576.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom-bench-planner: time to compile the Plans of large jobs"};
  int repeats = 10;
  app.add_option("--repeats", repeats, "compilations per job (median and min are printed)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  int rc = run("Llama-3-70B, 1024 ranks, tp 8, ZeRO 3", kLlama3_70b,
               trainSpec(1024, R"("tensor_parallel": {"autotp_size": 8})", 80), repeats);
  rc |= run("DeepSeek-V3, 1024 ranks, ep 64, ZeRO 3", kDeepseekV3,
            trainSpec(1024, R"("expert_parallel": {"enabled": true, "autoep_size": 64})", 141), repeats);
  return rc;
}
