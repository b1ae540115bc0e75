#include "planner/deepspeed_auto.h"

#include "planner/deepspeed_config.h"
#include "planner/deepspeed_keys.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;
using json = nlohmann::json;

TEST_CASE("deepspeed \"auto\": filled where the job decides it, else every field named at once",
          "[planner][deepspeed]") {
  // The HF Trainer's usual config: batch sizes, precision and schedule left to the integration.
  const json hf = json::parse(R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": "auto",
                                                       "total_num_steps": "auto"}}})");
  auto cuda = resolveAutoValues(hf, AutoContext{.cuda = true, .training = true, .trainSteps = 100});
  REQUIRE(cuda.isOk());
  CHECK_FALSE(cuda->contains("train_batch_size"));  // DeepSpeed derives it from micro x gas x dp
  CHECK((*cuda)["bf16"]["enabled"] == true);
  CHECK((*cuda)["fp16"]["enabled"] == false);
  CHECK((*cuda)["scheduler"]["params"]["total_num_steps"] == 100);
  CHECK((*cuda)["scheduler"]["params"]["warmup_max_lr"] == 3e-4);
  auto parsed = parseDeepSpeedConfig(*cuda, 8, true);
  REQUIRE(parsed.isOk());
  CHECK(parsed->trainBatchSize == 32);
  CHECK(parsed->precision == Precision::kBf16);

  auto cpu = resolveAutoValues(hf, AutoContext{.cuda = false, .training = true, .trainSteps = 100});
  REQUIRE(cpu.isOk());
  CHECK((*cpu)["bf16"]["enabled"] == false);

  // What the job does not decide stays to fill, all of it in one message.
  json open = hf;
  open["train_micro_batch_size_per_gpu"] = "auto";
  open["gradient_clipping"] = "auto";
  open["zero_optimization"] = {{"stage", 3}, {"reduce_bucket_size", "auto"}, {"sub_group_size", "auto"}};
  open["optimizer"]["params"]["betas"] = "auto";
  auto refused = resolveAutoValues(open, AutoContext{.cuda = true, .training = true, .trainSteps = 100});
  REQUIRE_FALSE(refused.isOk());
  const std::string message = refused.status().message();
  INFO(message);
  for (const char* field : {"deepspeed.train_batch_size", "deepspeed.train_micro_batch_size_per_gpu",
                            "deepspeed.gradient_accumulation_steps", "deepspeed.optimizer.params.betas"})
    CHECK(message.find(field) != std::string::npos);
  // The HF Trainer sizes these from the model's hidden_size, which the plan knows (ZeroConfig::sizedFor).
  CHECK(message.find("deepspeed.zero_optimization.reduce_bucket_size") == std::string::npos);
  CHECK(message.find("deepspeed.bf16") == std::string::npos);
  // Clipping takes DeepSpeed's default, 1.0, which is the HF Trainer's max_grad_norm default too.
  CHECK(message.find("deepspeed.gradient_clipping") == std::string::npos);

  // AutoEP's own "auto" values are DeepSpeed's, resolved from the model: left as they are.
  json autoep = hf;
  autoep["expert_parallel"] = {{"enabled", true}, {"top_k", "auto"}, {"score_func", "auto"}};
  auto kept = resolveAutoValues(autoep, AutoContext{.cuda = true, .training = true, .trainSteps = 100});
  REQUIRE(kept.isOk());
  CHECK((*kept)["expert_parallel"]["top_k"] == "auto");

  // A job that does not train needs no batch triple.
  json eval = json::parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})");
  auto evalResolved = resolveAutoValues(eval, AutoContext{.cuda = false, .training = false});
  REQUIRE(evalResolved.isOk());
  CHECK(evalResolved->empty());
}

TEST_CASE("deepspeed \"auto\": zero_optimization's sizes the HF Trainer takes from hidden_size", "[planner][deepspeed]") {
  const json ds = json::parse(R"({
    "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "sub_group_size": "auto"}})");
  // As a spec is read: DeepSpeed's own sections' other "auto"s take its defaults first.
  const ScreenedConfig screened = screenDeepSpeedKeys(ds);
  REQUIRE(screened.refusals.empty());
  auto resolved = resolveAutoValues(screened.config, AutoContext{.cuda = true, .training = true, .trainSteps = 10});
  REQUIRE(resolved.isOk());
  auto parsed = parseDeepSpeedConfig(*resolved, 8, true);
  INFO(parsed.status().toString());
  REQUIRE(parsed.isOk());
  CHECK(parsed->zero.reduceBucketSize == kSizedFromModel);
  CHECK(parsed->zero.subGroupSize == 1'000'000'000);  // DeepSpeed's own default for its "auto"
  // It reads back as "auto", so a stored spec parses to the same config.
  const json back = parsed->toJson();
  CHECK(back["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto");
  auto again = parseDeepSpeedConfig(back, 8, true);
  REQUIRE(again.isOk());
  CHECK(again->zero.paramPersistenceThreshold == kSizedFromModel);

  // hidden_size 4096: hidden², 0.9 hidden², 10 hidden, as transformers' HfTrainerDeepSpeedConfig.
  const ZeroConfig sized = parsed->zero.sizedFor(4096);
  CHECK(sized.reduceBucketSize == 16'777'216);
  CHECK(sized.prefetchBucketSize == 15'099'494);
  CHECK(sized.paramPersistenceThreshold == 40'960);
  // Given values stay.
  ZeroConfig given;
  CHECK(given.sizedFor(4096).reduceBucketSize == 500'000'000);
}
