#include "planner/deepspeed_config.h"

#include "planner/job_spec.h"
#include "tests/catch.h"

using loom::planner::DeepSpeedConfig;
using loom::planner::OptimizerType;
using loom::planner::parseDeepSpeedConfig;
using loom::planner::Precision;
using nlohmann::json;

namespace {

DeepSpeedConfig parsed(const std::string& text, int64_t dp = 2, bool training = true) {
  auto c = parseDeepSpeedConfig(json::parse(text), dp, training);
  INFO(c.status().toString());
  REQUIRE(c.isOk());
  return *c;
}

std::string errorOf(const std::string& text, int64_t dp = 2, bool training = true) {
  auto c = parseDeepSpeedConfig(json::parse(text), dp, training);
  REQUIRE_FALSE(c.isOk());
  return c.status().message();
}

const char* kAdam = R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-4}})";

}  // namespace

TEST_CASE("deepspeed: the batch triple is completed as DeepSpeed does", "[planner][deepspeed]") {
  auto both = parsed(std::string(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, )") + kAdam + "}");
  CHECK(both.gradientAccumulationSteps == 4);
  auto trainAndGas = parsed(std::string(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2, )") + kAdam + "}");
  CHECK(trainAndGas.microBatchSize == 8);
  auto microAndGas =
      parsed(std::string(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5, )") + kAdam + "}");
  CHECK(microAndGas.trainBatchSize == 30);
  auto trainOnly = parsed(std::string(R"({"train_batch_size": 8, )") + kAdam + "}");
  CHECK(trainOnly.microBatchSize == 4);
  CHECK(trainOnly.gradientAccumulationSteps == 1);
  auto microOnly = parsed(std::string(R"({"train_micro_batch_size_per_gpu": 4, )") + kAdam + "}");
  CHECK(microOnly.trainBatchSize == 8);
  // Floats that are whole numbers, as DeepSpeed configs often write them.
  CHECK(parsed(std::string(R"({"train_batch_size": 8.0, )") + kAdam + "}").trainBatchSize == 8);
}

TEST_CASE("deepspeed: inconsistent batch sizes are refused with the numbers", "[planner][deepspeed]") {
  CHECK(errorOf(std::string(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, )") + kAdam + "}") ==
        "deepspeed.train_batch_size: 30 is not divisible by train_micro_batch_size_per_gpu * data-parallel ranks = 8");
  CHECK(errorOf(std::string(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                                "gradient_accumulation_steps": 3, )") + kAdam + "}") ==
        "deepspeed.train_batch_size: 32 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 3 * "
        "data-parallel ranks 2");
  CHECK(errorOf("{" + std::string(kAdam) + "}") ==
        "deepspeed.train_batch_size: either train_batch_size or train_micro_batch_size_per_gpu must be given");
  // An eval job needs no batch triple.
  CHECK(parsed("{}", 2, /*training=*/false).microBatchSize == 1);
}

TEST_CASE("deepspeed: optimizers take DeepSpeed's names and defaults", "[planner][deepspeed]") {
  auto adam = parsed(R"({"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 2e-4,
                        "betas": [0.8, 0.9], "eps": 1e-6, "weight_decay": 0.1}}})");
  CHECK(adam.optimizer.type == OptimizerType::kAdam);
  CHECK(adam.optimizer.decoupledWeightDecay);  // DeepSpeed's Adam is AdamW unless adam_w_mode is false
  CHECK(adam.optimizer.beta1 == 0.8);
  CHECK(adam.optimizer.eps == 1e-6);
  auto l2 = parsed(R"({"train_batch_size": 2, "optimizer": {"type": "adam", "params": {"adam_w_mode": false}}})");
  CHECK_FALSE(l2.optimizer.decoupledWeightDecay);
  auto lion = parsed(R"({"train_batch_size": 2, "optimizer": {"type": "Lion"}})");
  CHECK(lion.optimizer.beta2 == 0.99);
  auto adagrad = parsed(R"({"train_batch_size": 2, "optimizer": {"type": "Adagrad"}})");
  CHECK(adagrad.optimizer.lr == 1e-2);
  CHECK(adagrad.optimizer.eps == 1e-10);
  CHECK(errorOf(R"({"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})") ==
        "deepspeed.optimizer.params.amsgrad: true is not supported (as in DeepSpeed)");
  CHECK(errorOf(R"({"train_batch_size": 2, "optimizer": {"type": "OneBitAdam"}})") ==
        "deepspeed.optimizer.type: \"OneBitAdam\" is not supported (supported: Adam, AdamW, Lion, Adagrad)");
  CHECK(errorOf(R"({"train_batch_size": 2, "optimizer": {"type": "Lion", "params": {"eps": 1e-8}}})") ==
        "deepspeed.optimizer.params.eps: unknown key");
  CHECK(errorOf(R"({"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})") ==
        "deepspeed.optimizer.params.betas: must be a list of 2 numbers, got [0.9]");
  CHECK(errorOf(R"({"train_batch_size": 2})").find("deepspeed.optimizer: required for a train job") == 0);
}

TEST_CASE("deepspeed: precision, schedulers and unsupported keys", "[planner][deepspeed]") {
  auto fp16 = parsed(std::string(R"({"train_batch_size": 2, "fp16": {"enabled": true, "initial_scale_power": 8,
                                     "hysteresis": 3}, )") + kAdam + "}");
  CHECK(fp16.precision == Precision::kFp16);
  CHECK(fp16.lossScale.initialScalePower == 8);
  CHECK(fp16.lossScale.hysteresis == 3);
  CHECK(parsed(std::string(R"({"train_batch_size": 2, "bf16": {"enabled": true}, )") + kAdam + "}").precision ==
        Precision::kBf16);
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "fp16": {"enabled": true}, "bf16": {"enabled": true}, )") +
                kAdam + "}") == "deepspeed.bf16.enabled: fp16 and bf16 cannot both be enabled");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "scheduler": {"type": "WarmupDecayLR"}, )") + kAdam + "}") ==
        "deepspeed.scheduler.params.total_num_steps: required field is missing");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "scheduler": {"type": "OneCycle"}, )") + kAdam + "}")
            .find("deepspeed.scheduler.type: \"OneCycle\" is not supported") == 0);
  auto zero2 = parsed(std::string(R"({"train_batch_size": 2, "zero_optimization": {"stage": 2,
      "reduce_bucket_size": 5e7, "overlap_comm": true, "offload_optimizer": {"device": "cpu"}}, )") + kAdam + "}");
  CHECK(zero2.zero.stage == 2);
  CHECK(zero2.zero.reduceBucketSize == 50'000'000);
  CHECK(zero2.zero.offloadOptimizer == "cpu");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "zero_optimization": {"stage": 1,
      "offload_optimizer": {"device": "nvme"}}, )") + kAdam + "}") ==
        "deepspeed.zero_optimization.offload_optimizer.device: \"nvme\" is not supported (none, cpu)");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "zero_optimization": {"offload_optimizer": {"device": "cpu"}},
      )") + kAdam + "}") ==
        "deepspeed.zero_optimization.offload_optimizer: needs ZeRO stage 1, 2 or 3 (as in DeepSpeed)");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "zero_optimization": {"stage": 2, "round_robin": true}, )") +
                kAdam + "}") == "deepspeed.zero_optimization.round_robin: unknown key");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "activation_checkpointing": {}, )") + kAdam + "}")
            .find("deepspeed.activation_checkpointing: not supported by this version") == 0);
  // The normalized config parses back to itself.
  auto full = parsed(std::string(R"({"train_batch_size": 4, "gradient_clipping": 0.5, "fp16": {"enabled": true},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}}, )") +
                     kAdam + "}");
  auto again = parseDeepSpeedConfig(full.toJson(), 2, true);
  REQUIRE(again.isOk());
  CHECK(again->toJson() == full.toJson());
}

TEST_CASE("train spec: sections, paths and their checks", "[planner][deepspeed]") {
  using loom::planner::parseJobSpec;
  const std::string base = R"({"name": "t", "kind": "train", "resources": {"ranks": 2},
    "model": {"config": "m/config.json"}, "data": {"train": "d.tokens", "seq_len": 64},
    "train": {"steps": 10}, "deepspeed": {"train_batch_size": 4, )" + std::string(kAdam) + "}}";
  auto spec = parseJobSpec(base);
  INFO(spec.status().toString());
  REQUIRE(spec.isOk());
  CHECK(spec->kind == loom::planner::JobKind::kTrain);
  CHECK(spec->deepspeed.microBatchSize == 2);
  auto again = parseJobSpec(spec->toJson().dump());
  REQUIRE(again.isOk());
  CHECK(again->toJson() == spec->toJson());
  // Relative paths become absolute against the spec's directory; absolute ones stay.
  json resolved = json::parse(loom::planner::resolveSpecPaths(base, "/jobs"));
  CHECK(resolved["model"]["config"] == "/jobs/m/config.json");
  CHECK(resolved["data"]["train"] == "/jobs/d.tokens");

  auto withTrain = [&](const std::string& train) {
    json j = json::parse(base);
    j["train"] = json::parse(train);
    auto s = parseJobSpec(j.dump());
    REQUIRE_FALSE(s.isOk());
    return s.status().message();
  };
  CHECK(withTrain(R"({"steps": 10, "eval_every": 5})") ==
        "train.eval_every: 5 needs data.eval, the token file to evaluate on");
  CHECK(withTrain(R"({"steps": 10, "checkpoint_every": 5})") == "train.checkpoint_every: 5 needs train.checkpoint_dir");
  CHECK(withTrain(R"({"eval_every": 5})") == "train.steps: required field is missing");
  json noModel = json::parse(base);
  noModel.erase("model");
  CHECK(parseJobSpec(noModel.dump()).status().message() == "model: required for a train job");
  json probeWithData = json::parse(R"({"name": "p", "kind": "probe", "resources": {"ranks": 1},
                                       "data": {"train": "x", "seq_len": 4}})");
  CHECK(parseJobSpec(probeWithData.dump()).status().message() == "data: does not apply to a probe job");
}
