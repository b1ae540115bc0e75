#include "planner/deepspeed_config.h"

#include <fmt/format.h>

#include "planner/job_spec.h"
#include "tests/catch.h"

using loom::planner::DeepSpeedConfig;
using loom::planner::OptimizerType;
using loom::planner::parseDeepSpeedConfig;
using loom::planner::Precision;
using nlohmann::json;

namespace {

DeepSpeedConfig parsed(const std::string& text, int64_t world = 2, bool training = true) {
  auto c = parseDeepSpeedConfig(json::parse(text), world, training);
  INFO(c.status().toString());
  REQUIRE(c.isOk());
  return *c;
}

std::string errorOf(const std::string& text, int64_t world = 2, bool training = true) {
  auto c = parseDeepSpeedConfig(json::parse(text), world, training);
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
        "deepspeed.optimizer.type: \"OneBitAdam\" is not supported (supported: Adam, AdamW, Lion, Adagrad, Muon)");
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
  auto zero3 = parsed(std::string(R"({"train_batch_size": 2, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "cpu", "pin_memory": false}}, )") + kAdam + "}");
  CHECK(zero3.zero.offloadParam == "cpu");
  CHECK_FALSE(zero3.zero.offloadParamPinMemory);
  auto zero3Again = parseDeepSpeedConfig(zero3.toJson(), 2, true);
  INFO(zero3Again.status().toString());
  REQUIRE(zero3Again.isOk());
  CHECK(zero3Again->zero.offloadParam == "cpu");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "zero_optimization": {"stage": 2,
      "offload_param": {"device": "cpu"}}, )") + kAdam + "}") ==
        "deepspeed.zero_optimization.offload_param: needs ZeRO stage 3, the stage that partitions parameters (as in "
        "DeepSpeed); this config has stage 2");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme"}}, )") + kAdam + "}") ==
        "deepspeed.zero_optimization.offload_param.device: \"nvme\" is not supported (none, cpu)");
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "zero_optimization": {"stage": 2, "round_robin": true}, )") +
                kAdam + "}") == "deepspeed.zero_optimization.round_robin: unknown key");
  auto checkpointed = parsed(std::string(R"({"train_batch_size": 2, "activation_checkpointing": {
      "cpu_checkpointing": true, "number_checkpoints": 3, "contiguous_memory_optimization": false}, )") + kAdam + "}");
  CHECK(checkpointed.activationCheckpointing.enabled);
  CHECK(checkpointed.activationCheckpointing.cpuCheckpointing);
  CHECK(checkpointed.activationCheckpointing.numberCheckpoints == 3);
  CHECK(!parsed(std::string(R"({"train_batch_size": 2, )") + kAdam + "}").activationCheckpointing.enabled);
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "activation_checkpointing": {"partition_activations": true},
      )") + kAdam + "}")
            .find("deepspeed.activation_checkpointing.partition_activations: true is not supported") == 0);
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "activation_checkpointing": {"number_checkpoints": 0}, )") +
                kAdam + "}")
            .find("deepspeed.activation_checkpointing.number_checkpoints") == 0);
  CHECK(errorOf(std::string(R"({"train_batch_size": 2, "activation_checkpointing": {"every_layer": true}, )") +
                kAdam + "}") == "deepspeed.activation_checkpointing.every_layer: unknown key");
  // Checkpointing survives the normalized config, and its absence too.
  auto checkpointedAgain = parseDeepSpeedConfig(checkpointed.toJson(), 2, true);
  REQUIRE(checkpointedAgain.isOk());
  CHECK(checkpointedAgain->activationCheckpointing.numberCheckpoints == 3);
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
  CHECK(withTrain(R"({"steps": 10, "profile_step": 11})") ==
        "train.profile_step: 11 is past the last step (train.steps is 10)");
  json noModel = json::parse(base);
  noModel.erase("model");
  CHECK(parseJobSpec(noModel.dump()).status().message() == "model: required for a train job");
  json probeWithData = json::parse(R"({"name": "p", "kind": "probe", "resources": {"ranks": 1},
                                       "data": {"train": "x", "seq_len": 4}})");
  CHECK(parseJobSpec(probeWithData.dump()).status().message() == "data: does not apply to a probe job");
}

TEST_CASE("deepspeed: tensor_parallel, expert_parallel and sequence_parallel_size - dp is world / (tp x sp)",
          "[planner][deepspeed]") {
  auto c = parsed(std::string(R"({"train_batch_size": 32, "sequence_parallel_size": 2,
      "tensor_parallel": {"autotp_size": 4, "partition_config": {"use_default_specs": false, "strict_mode": true,
        "layer_specs": [{"patterns": [".*\\.o_proj\\.weight$"], "partition_type": "row"},
                        {"patterns": [".*\\.qkv_proj\\.weight$"], "partition_type": "column",
                         "shape": [[4096, 1024, 1024], -1], "partition_dim": 0},
                        {"patterns": [".*q_norm.*"], "partition_type": "skip", "grad_allreduce": true}]}},
      "expert_parallel": {"enabled": true, "autoep_size": 4, "preset_model": "mixtral", "top_k": 2,
        "route_norm": false, "route_scale": 1.5, "score_func": "softmax", "num_expert_groups": 2,
        "num_limited_groups": 1, "routed_scaling_factor": 2.5, "has_shared_experts": false,
        "use_grouped_mm": false}, )") + kAdam + "}",
                  /*world=*/64);
  // 64 ranks = dp 8 x sp 2 x tp 4: the batch triple counts 8 data-parallel ranks.
  CHECK(c.dataParallelSize == 8);
  CHECK(c.microBatchSize == 4);
  CHECK(c.tensorParallel.ranks() == 4);
  CHECK_FALSE(c.tensorParallel.useDefaultSpecs);
  CHECK(c.tensorParallel.strictMode);
  REQUIRE(c.tensorParallel.layerSpecs.size() == 3);
  CHECK(c.tensorParallel.layerSpecs[0].split == loom::planner::TpSplit::kRow);
  CHECK(c.tensorParallel.layerSpecs[1].shape[0].subParams == std::vector<int64_t>{4096, 1024, 1024});
  CHECK(c.tensorParallel.layerSpecs[2].gradAllreduce);
  CHECK(c.expertParallel.ranks() == 4);
  CHECK(c.expertParallel.topK == 2);
  CHECK(*c.expertParallel.routedScalingFactor == 2.5);
  CHECK(c.sequenceParallelSize == 2);
  // Normalized and parsed again: the same.
  auto again = parseDeepSpeedConfig(c.toJson(), 64, true);
  INFO(again.status().toString());
  REQUIRE(again.isOk());
  CHECK(again->toJson() == c.toJson());
  // "auto" and null take the model's values when the plan is compiled.
  auto defaults = parsed(std::string(R"({"train_batch_size": 2, "expert_parallel": {"enabled": true,
      "top_k": "auto", "routed_scaling_factor": "auto", "route_norm": null}, )") + kAdam + "}");
  CHECK((defaults.expertParallel.topK == 0 && !defaults.expertParallel.routedScalingFactor));
  CHECK(defaults.toJson()["expert_parallel"]["top_k"] == "auto");
  CHECK(defaults.toJson()["tensor_parallel"]["autotp_size"] == 0);
}

TEST_CASE("deepspeed: bad parallel settings are refused by name", "[planner][deepspeed]") {
  auto error = [](const std::string& keys, int64_t world = 8) {
    return errorOf(std::string(R"({"train_micro_batch_size_per_gpu": 1, )") + keys + ", " + kAdam + "}", world);
  };
  CHECK(error(R"("tensor_parallel": {"autotp_size": 3})") ==
        "resources.ranks 8 cannot be split into deepspeed.tensor_parallel.autotp_size 3 x "
        "deepspeed.sequence_parallel_size 1: 8 is not a multiple of 3");
  CHECK(error(R"("tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": true})") ==
        "deepspeed.tensor_parallel.tp_overlap_comm: unknown key");
  CHECK(error(R"("tensor_parallel": {"partition_config": {"layer_specs": [{"partition_type": "row"}]}})") ==
        "deepspeed.tensor_parallel.partition_config.layer_specs[0].patterns: required, a list of regexes matched "
        "against parameter names");
  CHECK(error(R"("tensor_parallel": {"partition_config": {"layer_specs": [{"patterns": ["x"],
      "partition_type": "diagonal"}]}})") ==
        "deepspeed.tensor_parallel.partition_config.layer_specs[0].partition_type: must be column, row or skip, got "
        "\"diagonal\"");
  CHECK(error(R"("tensor_parallel": {"partition_config": {"layer_specs": [{"patterns": ["x"],
      "shape": [-1, [2, 2]]}]}})") ==
        "deepspeed.tensor_parallel.partition_config.layer_specs[0].shape[1]: a list of sub-parameter sizes is allowed "
        "only at partition_dim 0");
  CHECK(error(R"("tensor_parallel": {"partition_config": {"layer_specs": [{"patterns": ["x"],
      "partition_type": "row", "grad_allreduce": true}]}})")
            .find("layer_specs[0].grad_allreduce: applies to partition_type skip only") != std::string::npos);
  CHECK(error(R"("expert_parallel": {"autoep_size": 4})") ==
        "deepspeed.expert_parallel.autoep_size: 4 needs expert_parallel.enabled true");
  CHECK(error(R"("expert_parallel": {"enabled": true, "autoep_size": 4, "preset_model": "llama4"})")
            .find("deepspeed.expert_parallel.preset_model: \"llama4\" is not a preset") == 0);
  CHECK(error(R"("expert_parallel": {"enabled": true, "score_func": "relu"})") ==
        "deepspeed.expert_parallel.score_func: must be auto, softmax or sigmoid, got \"relu\"");
  CHECK(error(R"("expert_parallel": {"enabled": true, "num_expert_groups": 2, "num_limited_groups": 3})") ==
        "deepspeed.expert_parallel.num_limited_groups: 3 is above num_expert_groups 2");
  CHECK(error(R"("expert_parallel": {"enabled": true, "preset_model": "minimax_m3"})")
            .find("\"minimax_m3\" is a DeepSpeed preset for a model transformers 5.17 does not build") !=
        std::string::npos);
  CHECK(error(R"("expert_parallel": {"enabled": true, "load_balance_coeff": 0.001})")
            .find("deepspeed.expert_parallel.load_balance_coeff: not supported") == 0);
  CHECK(error(R"("expert_parallel": {"enabled": true, "autoep_size": 16})") ==
        "deepspeed.expert_parallel.autoep_size 16 must divide data parallel x sequence parallel = 8 x 1 = 8"
        " (resources.ranks 8 over tensor parallel 1): the experts split over ranks that hold the same tensor-parallel piece");
  CHECK(error(R"("sequence_parallel_size": 0)") ==
        "deepspeed.sequence_parallel_size: must be between 1 and 65536, got 0");
}

TEST_CASE("specs: parallelism the workers do not run yet is refused to run - accepted to plan", "[planner][deepspeed]") {
  using loom::planner::parseJobSpec;
  using loom::planner::SpecPurpose;
  auto spec = [](const std::string& keys) {
    return R"({"name": "t", "kind": "train", "resources": {"ranks": 8, "device": "cuda"},
      "model": {"config": "/m/config.json"}, "data": {"train": "/d.tokens", "seq_len": 64},
      "train": {"steps": 10}, "deepspeed": {"train_micro_batch_size_per_gpu": 1, )" +
           keys + ", " + kAdam + "}}";
  };
  // Tensor and sequence parallelism run.
  CHECK(parseJobSpec(spec(R"("tensor_parallel": {"autotp_size": 8})")).isOk());
  const std::string sp = spec(R"("sequence_parallel_size": 2)");
  CHECK(parseJobSpec(sp).isOk());
  CHECK(parseJobSpec(spec(R"("sequence_parallel_size": 2, "seq_parallel_communication_data_type": "fp64")"))
            .status()
            .message() == "deepspeed.seq_parallel_communication_data_type: \"fp64\" is not one of fp32, fp16, bf16");
  auto bf16Comm = parseJobSpec(spec(R"("sequence_parallel_size": 2, "seq_parallel_communication_data_type": "bf16")"));
  REQUIRE(bf16Comm.isOk());
  CHECK(bf16Comm->deepspeed.sequenceCommunicationType == loom::planner::Precision::kBf16);
  CHECK(bf16Comm->toJson()["deepspeed"]["seq_parallel_communication_data_type"] == "bf16");
  CHECK(parseJobSpec(sp)->toJson()["deepspeed"]["seq_parallel_communication_data_type"] == "fp32");
  // Expert parallelism runs, at every ZeRO stage; beside Muon it is only planned.
  CHECK(parseJobSpec(spec(R"("expert_parallel": {"enabled": true, "autoep_size": 4})")).isOk());
  const std::string muon = R"({"name": "t", "kind": "train", "resources": {"ranks": 8, "device": "cuda"},
      "model": {"config": "/m/config.json"}, "data": {"train": "/d.tokens", "seq_len": 64}, "train": {"steps": 10},
      "deepspeed": {"train_micro_batch_size_per_gpu": 1, "expert_parallel": {"enabled": true, "autoep_size": 4},
      "optimizer": {"type": "Muon", "params": {"lr": 0.02}}}})";
  CHECK(parseJobSpec(muon).status().message() ==
        "deepspeed.expert_parallel.autoep_size: 4 with the Muon optimizer is planned (loomctl plan) but not run by "
        "the workers yet (its experts' matrices would need Newton-Schulz batched per expert)");
  CHECK(parseJobSpec(muon, SpecPurpose::kPlan).isOk());
  auto planned = parseJobSpec(sp, SpecPurpose::kPlan);
  REQUIRE(planned.isOk());
  CHECK(planned->deepspeed.dataParallelSize == 4);
  // tp 1 (and autotp_size 0, off) runs.
  CHECK(parseJobSpec(spec(R"("tensor_parallel": {"autotp_size": 1})")).isOk());
  // resources.device_memory_gb: 80 on cuda unless given, no limit on cpu.
  CHECK(planned->deviceMemoryGb == 80);
  CHECK(planned->deviceMemoryBytes() == int64_t(80) << 30);
  CHECK(planned->toJson()["resources"]["device_memory_gb"] == 80);
  json cpu = json::parse(spec(R"("sequence_parallel_size": 1)"));
  cpu["resources"] = {{"ranks", 8}, {"device", "cpu"}};
  auto onCpu = parseJobSpec(cpu.dump());
  REQUIRE(onCpu.isOk());
  CHECK(onCpu->deviceMemoryBytes() == 0);
  CHECK_FALSE(onCpu->toJson()["resources"].contains("device_memory_gb"));
  cpu["resources"]["device_memory_gb"] = 0;
  CHECK(parseJobSpec(cpu.dump()).status().message() ==
        "resources.device_memory_gb: must be between 0.001 and 1000000, got 0");
}

TEST_CASE("Muon: DeepSpeed's keys and each half's defaults", "[planner][config][muon]") {
  const auto defaults = parsed(R"({"train_batch_size": 4, "optimizer": {"type": "Muon"}})");
  const auto& o = defaults.optimizer;
  CHECK(o.type == OptimizerType::kMuon);
  // MuonWithAuxAdam: Muon lr 0.02, momentum 0.95, gram; its Adam lr 3e-4, betas (0.9, 0.95), eps 1e-10.
  CHECK((o.muon.lr == 0.02 && o.muon.momentum == 0.95 && o.muon.nsMethod == loom::planner::NsMethod::kGram));
  CHECK((o.lr == 3e-4 && o.beta1 == 0.9 && o.beta2 == 0.95 && o.eps == 1e-10 && o.weightDecay == 0));
  CHECK_FALSE(o.muon.perHead);
  CHECK(o.auxiliary().type == OptimizerType::kAdamW);

  // The shared lr sets both halves; muon_lr and adam_lr set their own; weight_decay is shared.
  const auto shared = parsed(R"({"train_batch_size": 4, "optimizer": {"type": "Muon", "params":
      {"lr": 0.01, "weight_decay": 0.1, "adam_lr": 1e-3, "ns_method": "standard", "per_head_muon": true,
       "momentum": 0.9, "betas": [0.8, 0.9], "eps": 1e-8, "adam_w_mode": false, "torch_adam": true}}})");
  CHECK((shared.optimizer.muon.lr == 0.01 && shared.optimizer.lr == 1e-3));
  CHECK((shared.optimizer.muon.weightDecay == 0.1 && shared.optimizer.weightDecay == 0.1));
  CHECK((shared.optimizer.muon.nsMethod == loom::planner::NsMethod::kStandard && shared.optimizer.muon.perHead));
  CHECK(shared.optimizer.auxiliary().type == OptimizerType::kAdam);  // adam_w_mode false: L2 decay
  auto again = parseDeepSpeedConfig(shared.toJson(), 2, true);
  REQUIRE(again.isOk());
  CHECK(again->toJson() == shared.toJson());

  CHECK(errorOf(R"({"train_batch_size": 4, "optimizer": {"type": "Muon", "params": {"nesterov": true}}})") ==
        "deepspeed.optimizer.params.nesterov: unknown key");
  CHECK(errorOf(R"({"train_batch_size": 4, "optimizer": {"type": "Muon", "params": {"ns_method": "svd"}}})") ==
        "deepspeed.optimizer.params.ns_method: \"svd\" is not a Newton-Schulz method (gram or standard)");
  CHECK(errorOf(R"({"train_batch_size": 4, "optimizer": {"type": "Muon", "params": {"momentum": 1.0}}})") ==
        "deepspeed.optimizer.params.momentum: must be in [0, 1), got 1");
}

TEST_CASE("deepspeed: every AutoEP key of DeepSpeed 0.19.8 at its default is accepted, the rest refused with the "
          "reason",
          "[planner][deepspeed]") {
  // DeepSpeed 0.19.8's defaults for the keys Loom does not act on.
  const std::string defaults = R"("enabled": true, "expert_tensor_parallel_size": 1, "validate_folding_routing": false,
      "async_split_plan": false, "moe_layer_pattern": null, "expert_pattern": null, "router_pattern": null,
      "disable_triton_grouped_mm": false, "score_apply": "auto", "combine_impl": "auto", "row_weighting_impl": "auto",
      "gate_up_impl": "separate", "comm_backend": "comm", "comm_num_sm": 12, "comm_qp_margin": 4,
      "comm_max_tokens_per_rank": 0, "load_balance_coeff": null, "expert_w1": null, "expert_w2": null,
      "expert_w3": null, "num_experts_attr": null, "top_k_attr": null, "has_shared_experts": null,
      "shared_experts_pattern": null, "shared_experts_gate_pattern": null, "expert_activation": null)";
  auto withEp = [&](const std::string& keys) {
    return std::string(R"({"train_batch_size": 2, "expert_parallel": {)") + keys + "}, " + kAdam + "}";
  };
  CHECK(parsed(withEp(defaults)).expertParallel.enabled);
  CHECK(errorOf(withEp(R"("enabled": true, "comm_backend": "deepep")"))
            .find("deepspeed.expert_parallel.comm_backend: \"deepep\" is not supported") == 0);
  CHECK(errorOf(withEp(R"("enabled": true, "expert_w1": "gate_up_proj")"))
            .find("deepspeed.expert_parallel.expert_w1: not supported: Loom builds the MoE layers") == 0);
  CHECK(errorOf(withEp(R"("enabled": true, "expert_tensor_parallel_size": 2)"))
            .find("deepspeed.expert_parallel.expert_tensor_parallel_size: 2 is not supported") == 0);
  CHECK(errorOf(withEp(R"("enabled": true, "load_balance_coeff": 0.01)"))
            .find("deepspeed.expert_parallel.load_balance_coeff: not supported") == 0);
  CHECK(errorOf(withEp(R"("enabled": true, "routing_noise": 0.1)")) ==
        "deepspeed.expert_parallel.routing_noise: unknown key");
  CHECK(errorOf(withEp(R"("gate_up_impl": "fused")"))
            .find("deepspeed.expert_parallel.gate_up_impl: needs expert_parallel.enabled true") == 0);
  auto fused = parsed(withEp(R"("enabled": true, "gate_up_impl": "fused", "expert_activation": "swiglu_oai")"));
  CHECK(fused.expertParallel.gateUpImpl == "fused");
  CHECK(fused.expertParallel.expertActivation == "swiglu_oai");
}

TEST_CASE("deepspeed: which precisions skip a step whose gradient norm is not finite, as DeepSpeed 0.19.8",
          "[planner][deepspeed]") {
  auto skips = [](const char* precision, int stage, const char* bf16Extra = "") {
    const std::string text = fmt::format(R"({{"train_batch_size": 2, "zero_optimization": {{"stage": {}}}, {}}})",
                                         stage, std::string(precision) == "bf16"
                                                    ? fmt::format(R"("bf16": {{"enabled": true{}}})", bf16Extra)
                                                    : std::string(precision) == "fp16" ? R"("fp16": {"enabled": true})"
                                                                                       : R"("steps_per_print": 1)");
    auto c = parseDeepSpeedConfig(json::parse(text), 2, false);
    REQUIRE(c.isOk());
    return c->skipsNonFiniteSteps();
  };
  for (int stage : {0, 1, 2, 3}) CHECK(skips("fp16", stage));     // the loss scale drops
  for (int stage : {0, 1, 2, 3}) CHECK_FALSE(skips("fp32", stage));
  CHECK(skips("bf16", 0));                                        // BF16_Optimizer
  CHECK(skips("bf16", 1));                                        // check_grad_overflow, default true
  CHECK(skips("bf16", 2));
  CHECK_FALSE(skips("bf16", 2, R"(, "check_grad_overflow": false)"));
  CHECK_FALSE(skips("bf16", 3));                                  // stage 3 checks fp16 only
}

TEST_CASE("deepspeed: wandb's section, its defaults, Loom's dir under the spec's directory", "[planner][deepspeed]") {
  const std::string batch = R"("train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, )";
  auto on = parsed("{" + batch + kAdam + R"(, "wandb": {"enabled": true, "group": "g", "team": "t"}})");
  CHECK(on.wandb.enabled);
  CHECK(on.wandb.project == "deepspeed");  // DeepSpeed's default
  CHECK(on.wandb.group == "g");
  CHECK(on.wandb.team == "t");
  CHECK(on.toJson()["wandb"]["project"] == "deepspeed");
  auto off = parsed("{" + batch + kAdam + R"(, "wandb": {"enabled": false}})");
  CHECK_FALSE(off.toJson().contains("wandb"));  // its `dir` is Loom's: DeepSpeed would refuse it

  CHECK(errorOf("{" + batch + kAdam + R"(, "wandb": {"enabled": true, "entity": "t"}})").find("deepspeed.wandb.entity") !=
        std::string::npos);
  CHECK(errorOf("{" + batch + kAdam + R"(, "wandb": {"enabled": true, "project": ""}})") ==
        "deepspeed.wandb.project: empty (wandb needs a project)");

  json config = json::parse(R"({"wandb": {"enabled": true}, "tensorboard": {"enabled": true}})");
  loom::planner::resolveMonitorPaths(config, "/jobs/specs");
  CHECK(config["wandb"]["dir"] == "/jobs/specs");
  config["wandb"]["dir"] = "runs/../out";
  loom::planner::resolveMonitorPaths(config, "/jobs/specs");
  CHECK(config["wandb"]["dir"] == "/jobs/specs/out");
}

TEST_CASE("deepspeed: the flops profiler's section, its defaults, its output file under the spec's directory",
          "[planner][deepspeed]") {
  const std::string batch = R"("train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, )";
  auto defaults = parsed("{" + batch + kAdam + R"(, "flops_profiler": {"enabled": true}})");
  const auto& f = defaults.flopsProfiler;
  CHECK(f.enabled);
  CHECK(f.profileStep == 1);  // DeepSpeed's defaults
  CHECK(f.moduleDepth == -1);
  CHECK(f.topModules == 1);
  CHECK(f.detailed);
  CHECK(f.outputFile.empty());
  CHECK(defaults.toJson()["flops_profiler"]["output_file"].is_null());
  auto set = parsed("{" + batch + kAdam + R"(, "flops_profiler": {"enabled": true, "profile_step": 3, "module_depth": 2,
      "top_modules": 4, "detailed": false, "output_file": "/tmp/p.txt", "recompute_fwd_factor": 1.0}})");
  CHECK(set.flopsProfiler.profileStep == 3);
  CHECK(set.flopsProfiler.moduleDepth == 2);
  CHECK(set.flopsProfiler.topModules == 4);
  CHECK_FALSE(set.flopsProfiler.detailed);
  CHECK(set.flopsProfiler.recomputeFwdFactor == 1.0);
  CHECK(parsed(set.toJson().dump()).flopsProfiler.outputFile == "/tmp/p.txt");  // its normalized form parses again
  CHECK_FALSE(parsed("{" + batch + kAdam + R"(, "flops_profiler": {"enabled": false}})").toJson().contains("flops_profiler"));

  CHECK(errorOf("{" + batch + kAdam + R"(, "flops_profiler": {"enabled": true, "top_modules": 0}})")
            .find("deepspeed.flops_profiler.top_modules") != std::string::npos);
  CHECK(errorOf("{" + batch + kAdam + R"(, "flops_profiler": {"enabled": true, "module_depth": -2}})")
            .find("deepspeed.flops_profiler.module_depth") != std::string::npos);
  CHECK(errorOf("{" + batch + kAdam + R"(, "flops_profiler": {"enabled": true, "profile_step": "1"}})")
            .find("deepspeed.flops_profiler.profile_step") != std::string::npos);

  json config = json::parse(R"({"flops_profiler": {"enabled": true, "output_file": "profiles/../flops.txt"}})");
  loom::planner::resolveMonitorPaths(config, "/jobs/specs");
  CHECK(config["flops_profiler"]["output_file"] == "/jobs/specs/flops.txt");
}
