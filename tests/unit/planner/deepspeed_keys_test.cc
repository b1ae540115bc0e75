#include "planner/deepspeed_keys.h"

#include <fstream>
#include <set>
#include <sstream>

#include "planner/job_spec.h"
#include "planner/json_reader.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;
using json = nlohmann::json;

namespace {

std::string trainSpec(const json& deepspeed) {
  return json{{"name", "t"},
              {"kind", "train"},
              {"resources", {{"ranks", 2}}},
              {"model", {{"config", "/m/config.json"}}},
              {"data", {{"train", "/d.tokens"}, {"seq_len", 8}}},
              {"train", {{"steps", 10}}},
              {"deepspeed", deepspeed}}
      .dump();
}

// The HF Trainer docs' ZeRO-3 config, as users paste it.
const json kHfZero3 = json::parse(R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                               "warmup_num_steps": "auto"}},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                        "offload_param": {"device": "cpu", "pin_memory": true}, "overlap_comm": true,
                        "contiguous_gradients": true, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                        "stage3_gather_16bit_weights_on_model_save": true},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false})");

}  // namespace

TEST_CASE("a pasted DeepSpeed config: everything it needs changed, in one message", "[planner][deepspeed]") {
  auto parsed = parseJobSpec(trainSpec(kHfZero3));
  REQUIRE_FALSE(parsed.isOk());
  const std::string message = parsed.status().message();
  INFO(message);
  CHECK(message.rfind("deepspeed: \"auto\" is filled only where the job decides the value", 0) == 0);
  for (const char* field : {"deepspeed.train_batch_size", "deepspeed.optimizer.params.lr",
                            "deepspeed.optimizer.params.betas", "deepspeed.scheduler.params.warmup_num_steps"})
    CHECK(message.find(field) != std::string::npos);
  // DeepSpeed's sections take their default for "auto" (three sizes come from the model's
  // hidden_size, as the HF Trainer's), and clipping is DeepSpeed's default: not asked for.
  for (const char* field : {"deepspeed.zero_optimization.reduce_bucket_size",
                            "deepspeed.zero_optimization.stage3_prefetch_bucket_size", "deepspeed.gradient_clipping",
                            "deepspeed.fp16"})
    CHECK(message.find(field) == std::string::npos);

  // Filled in, it is accepted; the values at DeepSpeed's defaults stay out.
  json filled = kHfZero3;
  filled["train_micro_batch_size_per_gpu"] = 2;
  filled["optimizer"]["params"] = {{"lr", 1e-4}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.01}};
  filled["scheduler"]["params"] = {{"warmup_min_lr", 0}, {"warmup_max_lr", 1e-4}, {"warmup_num_steps", 5}};
  auto spec = parseJobSpec(trainSpec(filled));
  INFO((spec.isOk() ? "" : spec.status().message()));
  REQUIRE(spec.isOk());
  CHECK(spec->deepspeed.zero.stage == 3);
  CHECK(spec->deepspeed.zero.offloadOptimizer == "cpu");
  CHECK(spec->deepspeed.zero.offloadParam == "cpu");
  CHECK(spec->deepspeed.trainBatchSize == 4);
  CHECK(spec->deepspeed.gradientClipping == 1.0);
  CHECK(spec->deepspeed.zero.reduceBucketSize == kSizedFromModel);  // the HF Trainer's hidden_size²
  CHECK(spec->deepspeed.zero.subGroupSize == 1'000'000'000);        // DeepSpeed's default
  CHECK(spec->deepspeed.precision == Precision::kFp32);         // fp16 "auto" on CPU ranks
  CHECK(spec->toJson()["deepspeed"]["wall_clock_breakdown"] == false);
}

TEST_CASE("each kind of refusal names the key and says why", "[planner][deepspeed]") {
  const json config = json::parse(R"({
    "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "use_data_before_expert_parallelism": true, "elasticity": {"enabled": true}, "zero_optimizatoin": {"stage": 2},
    "zero_optimization": {"stage": 2, "cpu_offload": true, "mics_shard_size": 2, "allgather_bucket_size": 2e8},
    "bf16": {"enabled": true, "bf16_optimizer_states": true},
    "wandb": {"enabled": true, "project": "p"},
    "flops_profiler": {"enabled": false, "profile_step": 1}, "dump_state": true})");
  ScreenedConfig screened = screenDeepSpeedKeys(config);
  const std::vector<std::string> expected{
      "deepspeed.bf16.bf16_optimizer_states: true is not supported: not supported: the optimizer state is fp32",
      "deepspeed.elasticity: removed in DeepSpeed 0.19.8, which refuses it too (elastic training): set the batch "
      "sizes directly",
      "deepspeed.use_data_before_expert_parallelism: true is not supported: not supported: experts see the data of "
      "their expert-parallel group (DeepSpeed's default)",
      "deepspeed.zero_optimization.cpu_offload: true is not supported: deprecated by DeepSpeed in favour of "
      "`offload_optimizer`",
      "deepspeed.zero_optimization.mics_shard_size: removed in DeepSpeed 0.19.8, which refuses it too (MiCS)",
      "deepspeed.zero_optimizatoin: not a key of DeepSpeed 0.19.8's config"};
  CHECK(screened.refusals == expected);
  // Ignored keys and disabled sections go; keys with no effect stay, for the normalized spec.
  CHECK_FALSE(screened.config.contains("dump_state"));
  CHECK(screened.config["flops_profiler"]["enabled"] == false);  // honoured: the parser reads it
  CHECK(screened.config["zero_optimization"]["allgather_bucket_size"] == 2e8);

  CHECK(specProblems({}).isOk());
  CHECK(specProblems({"deepspeed.x: why"}).message() == "deepspeed.x: why");
  CHECK(specProblems({"a", "b"}).message() == "2 problems:\n  a\n  b");
}

TEST_CASE("bfloat16, bf16's older name, shares its keys", "[planner][deepspeed]") {
  ScreenedConfig screened = screenDeepSpeedKeys(json::parse(R"({"bfloat16": {"enabled": true, "immediate_grad_update": true}})"));
  REQUIRE(screened.refusals.size() == 1);
  CHECK(screened.refusals[0] == "deepspeed.bfloat16.immediate_grad_update: true is not supported: not supported");
}

TEST_CASE("docs/training.md lists every key of the catalogue, as the catalogue has it", "[planner][deepspeed]") {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/docs/training.md");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  std::set<std::string> paths;
  for (const DeepSpeedKey& k : deepSpeedKeys()) {
    CHECK(paths.insert(std::string(k.path)).second);  // listed once
    const std::string row = "| `" + std::string(k.path) + "` | " + keyUseName(k.use) + " |";
    INFO(row);
    CHECK(doc.find(row) != std::string::npos);
  }
}
