#include "planner/job_spec.h"

#include "tests/catch.h"

using loom::StatusCode;
using loom::planner::parseJobSpec;

namespace {

std::string errorOf(const std::string& spec) {
  auto parsed = parseJobSpec(spec);
  REQUIRE_FALSE(parsed.isOk());
  CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
  return parsed.status().message();
}

}  // namespace

TEST_CASE("a minimal spec gets every default", "[planner]") {
  auto spec = parseJobSpec(R"({"name": "p", "kind": "probe", "resources": {"ranks": 4}})");
  REQUIRE(spec.isOk());
  CHECK(spec->ranks == 4);
  CHECK(spec->device == loom::planner::DeviceKind::kCpu);
  CHECK(spec->probe.ticks == 10);
  CHECK(spec->probe.tickMs == 100);
  CHECK(spec->maxRestarts == 0);
  CHECK(spec->gracePeriodMs == 10'000);
  CHECK(spec->heartbeatTimeoutMs == 30'000);
  // The normalized form parses back to the same spec.
  auto again = parseJobSpec(spec->toJson().dump());
  REQUIRE(again.isOk());
  CHECK(again->toJson() == spec->toJson());
}

TEST_CASE("every field of a full spec is read", "[planner]") {
  auto spec = parseJobSpec(R"({"name": "p-1.x", "kind": "probe", "resources": {"ranks": 2, "device": "cuda"},
    "probe": {"ticks": 3, "tick_ms": 7}, "restart": {"max_restarts": 2, "on_preemption": false},
    "timeouts": {"grace_period_s": 1.5, "heartbeat_timeout_s": 4}})");
  REQUIRE(spec.isOk());
  CHECK(spec->device == loom::planner::DeviceKind::kCuda);
  CHECK(spec->probe.ticks == 3);
  CHECK(spec->probe.tickMs == 7);
  CHECK(spec->maxRestarts == 2);
  CHECK_FALSE(spec->restartOnPreemption);
  CHECK(spec->gracePeriodMs == 1500);
  CHECK(spec->heartbeatTimeoutMs == 4000);
}

TEST_CASE("bad specs name the field", "[planner]") {
  CHECK(errorOf("{").find("not valid JSON") != std::string::npos);
  CHECK(errorOf("3").find("must be a JSON object") != std::string::npos);
  CHECK(errorOf(R"({"kind": "probe", "resources": {"ranks": 1}})") == "name: required field is missing");
  CHECK(errorOf(R"({"name": "p", "resources": {"ranks": 1}})") == "kind: required field is missing");
  CHECK(errorOf(R"({"name": "p", "kind": "probe"})") == "resources: required field is missing");
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": {}})") == "resources.ranks: required field is missing");
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": {"ranks": 0}})") ==
        "resources.ranks: must be between 1 and 65536, got 0");
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": {"ranks": 1.5}})") ==
        "resources.ranks: must be an integer, got number");
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": "4"})") == "resources: must be an object, got string");
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": {"ranks": 1}, "extra": 1})") == "extra: unknown key");
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": {"ranks": 1, "gpu": 1}})") ==
        "resources.gpu: unknown key");
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": {"ranks": 1}, "restart": {"max_restarts": -1}})")
            .find("restart.max_restarts") == 0);
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": {"ranks": 1}, "restart": {"on_preemption": 1}})") ==
        "restart.on_preemption: must be true or false, got number");
  CHECK(errorOf(R"({"name": "p", "kind": "probe", "resources": {"ranks": 1}, "timeouts": {"grace_period_s": "x"}})")
            .find("timeouts.grace_period_s") == 0);
  CHECK(errorOf(R"({"name": "a b", "kind": "probe", "resources": {"ranks": 1}})").find("name:") == 0);
  CHECK(errorOf(R"({"name": "p", "kind": "serve", "resources": {"ranks": 1}})").find("kind: \"serve\"") == 0);
}

TEST_CASE("rollout specs: engine limits, sampling defaults, and what is refused", "[planner]") {
  const std::string head = R"({"name": "r", "kind": "rollout", "resources": {"ranks": 1},
    "model": {"config": "/m/config.json"}, "rollout": )";
  auto spec = parseJobSpec(head + R"({"prompts": "/p.jsonl", "output": "/o.jsonl", "max_num_seqs": 64,
    "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "n": 2, "stop": "END", "max_tokens": 32}}})");
  REQUIRE(spec.isOk());
  CHECK(spec->rollout.maxNumSeqs == 64);
  CHECK(spec->rollout.blockSize == 16);
  CHECK(spec->rollout.dtype == "float32");  // auto, on the cpu
  CHECK(spec->rollout.sampling.topK == 0);
  CHECK(spec->rollout.sampling.stop == std::vector<std::string>{"END"});
  CHECK(spec->rollout.sampling.maxNewTokens == 32);
  CHECK(spec->rollout.asyncScheduling);
  auto again = parseJobSpec(spec->toJson().dump());
  REQUIRE(again.isOk());
  CHECK(again->toJson() == spec->toJson());

  auto rolloutError = [&](const std::string& rollout) { return errorOf(head + rollout + "}"); };
  CHECK(rolloutError(R"({"output": "/o.jsonl"})").find("rollout.prompts: required") == 0);
  CHECK(rolloutError(R"({"serve": true, "prompts": "/p.jsonl"})").find("rollout.serve") == 0);
  CHECK(rolloutError(R"({"serve": true, "output": "/o.jsonl"})").find("rollout.serve") == 0);
  auto served = parseJobSpec(head + R"({"serve": true}})");
  REQUIRE(served.isOk());
  CHECK(served->rollout.serve);
  CHECK(checkRunnable(*served).isOk());
  CHECK(rolloutError(R"({"prompts": "/p", "output": "/o", "sampling": {"top_p": 0}})")
            .find("rollout.sampling.top_p: 0 is outside (0, 1]") == 0);
  CHECK(rolloutError(R"({"prompts": "/p", "output": "/o", "sampling": {"top_p": 1.5}})").find("rollout.sampling.top_p") == 0);
  CHECK(rolloutError(R"({"prompts": "/p", "output": "/o", "sampling": {"beam_width": 4}})")
            .find("rollout.sampling.beam_width: unknown key") == 0);
  CHECK(rolloutError(R"({"prompts": "/p", "output": "/o", "use_shared_prefill": true})")
            .find("rollout.use_shared_prefill: continuous batching does not support shared prompt prefill") == 0);
  CHECK(rolloutError(R"({"prompts": "/p", "output": "/o", "max_num_seqs": 512, "max_num_batched_tokens": 256})")
            .find("rollout.max_num_batched_tokens") == 0);
  CHECK(rolloutError(R"({"prompts": "/p", "output": "/o", "dtype": "int8"})").find("rollout.dtype") == 0);
  CHECK(rolloutError(R"({"prompts": "/p", "output": "/o", "async_scheduling": "yes"})").find("rollout.async_scheduling") == 0);
  auto synchronous = parseJobSpec(head + R"({"prompts": "/p", "output": "/o", "async_scheduling": false}})");
  REQUIRE(synchronous.isOk());
  CHECK(!synchronous->rollout.asyncScheduling);
  CHECK(parseJobSpec(synchronous->toJson().dump())->rollout.asyncScheduling == false);
  CHECK(errorOf(R"({"name": "r", "kind": "rollout", "resources": {"ranks": 2}, "model": {"config": "/m/config.json"},
    "rollout": {"prompts": "/p", "output": "/o"}})")
            .find("resources.ranks: 2 ranks for a rollout") == 0);
  CHECK(errorOf(R"({"name": "r", "kind": "rollout", "resources": {"ranks": 1}, "model": {"config": "/m/config.json"},
    "data": {"seq_len": 8}, "rollout": {"prompts": "/p", "output": "/o"}})")
            .find("data: does not apply to a rollout job") == 0);
}

TEST_CASE("probe.collectives, timeouts and deepspeed.comms_logger", "[planner]") {
  auto spec = parseJobSpec(R"({"name": "p", "kind": "probe", "resources": {"ranks": 2},
    "probe": {"collectives": {"ops": ["all_reduce", "broadcast"], "max_bytes": 1024, "dtype": "bfloat16",
                              "repeats": 3, "shared_memory": false}},
    "timeouts": {"collective_s": 5, "rendezvous_s": 7},
    "deepspeed": {"comms_logger": {"enabled": true, "verbose": false, "prof_all": false, "debug": false,
                                   "prof_ops": ["all_reduce", "all_gather_into_tensor"]}}})");
  REQUIRE(spec.isOk());
  REQUIRE(spec->probe.collectives.has_value());
  CHECK(spec->probe.collectives->ops == std::vector<std::string>{"all_reduce", "broadcast"});
  CHECK(spec->probe.collectives->minBytes == 8);
  CHECK(spec->probe.collectives->maxBytes == 1024);
  CHECK(spec->probe.collectives->repeats == 3);
  CHECK_FALSE(spec->probe.collectives->sharedMemory);
  CHECK(spec->collectiveTimeoutMs == 5000);
  CHECK(spec->rendezvousTimeoutMs == 7000);
  CHECK(spec->deepspeed.commsLogger.enabled);
  CHECK_FALSE(spec->deepspeed.commsLogger.profAll);
  CHECK(spec->deepspeed.commsLogger.profOps == std::vector<std::string>{"all_reduce", "all_gather"});
  auto again = parseJobSpec(spec->toJson().dump());
  REQUIRE(again.isOk());
  CHECK(again->toJson() == spec->toJson());

  const std::string base = R"({"name": "p", "kind": "probe", "resources": {"ranks": 2}, )";
  CHECK(errorOf(base + R"("probe": {"collectives": {"ops": ["allreduce"]}}})") ==
        "probe.collectives.ops: \"allreduce\" is not one of all_gather, all_reduce, all_to_all, all_to_all_v, broadcast, "
        "reduce_scatter");
  CHECK(errorOf(base + R"("probe": {"collectives": {"min_bytes": 9, "max_bytes": 8}}})").find("probe.collectives.min_bytes") == 0);
  CHECK(errorOf(base + R"("probe": {"collectives": {"repeats": 0}}})").find("probe.collectives.repeats") == 0);
  CHECK(errorOf(base + R"("probe": {"collectives": {"shared_memory": "yes"}}})").find("probe.collectives.shared_memory") == 0);
  CHECK(errorOf(base + R"("deepspeed": {"pipeline": {"stages": 2}}})") ==
        "deepspeed.pipeline: {\"stages\":2} is not supported: pipeline parallelism is not supported (DeepSpeed "
        "applies it to a PipelineModule only)");
  CHECK(errorOf(base + R"("deepspeed": {"comms_logger": {"prof_ops": ["allreduce"]}}})").find(
            "deepspeed.comms_logger.prof_ops: \"allreduce\" is not one of") == 0);
  CHECK(errorOf(base + R"("deepspeed": {"comms_logger": {"enabled": 1}}})") ==
        "deepspeed.comms_logger.enabled: must be true or false, got number");
}

TEST_CASE("eval.entropy, eval.kl_reference and model.loss_block_rows - read, kept, checked", "[planner]") {
  const std::string eval = R"({"name": "e", "kind": "eval", "resources": {"ranks": 2},
    "model": {"config": "/m/config.json", "loss_block_rows": 512}, "data": {"eval": "/d.tokens", "seq_len": 8},
    "eval": {"entropy": true, "kl_reference": "ref"}})";
  auto spec = parseJobSpec(loom::planner::resolveSpecPaths(eval, "/jobs"));
  REQUIRE(spec.isOk());
  CHECK(spec->model.lossBlockRows == 512);
  CHECK(spec->eval.entropy);
  CHECK(spec->eval.klReference == "/jobs/ref");  // relative to the spec's folder, as every path
  auto again = parseJobSpec(spec->toJson().dump());
  REQUIRE(again.isOk());
  CHECK(again->toJson() == spec->toJson());
  auto patched = [&](const std::string& from, const std::string& to) {
    std::string s = eval;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  CHECK(errorOf(patched(R"("entropy": true)", R"("entropy": 1)")) == "eval.entropy: must be true or false, got number");
  CHECK(errorOf(patched("512", "-1")).find("model.loss_block_rows: must be between 0 and") == 0);
}

TEST_CASE("convert jobs to loom: the layout, the checkpoint's settings where it leaves them out", "[planner]") {
  auto spec = parseJobSpec(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "to": "loom",
                "layout": {"ranks": 8, "zero_stage": 3, "stage3_param_persistence_threshold": 100}}})");
  REQUIRE(spec.isOk());
  const loom::planner::ConvertLayout& l = spec->convert.layout;
  CHECK(l.ranks == 8);
  CHECK(l.zeroStage == 3);
  CHECK(l.tensorParallel == 0);
  CHECK(l.sequenceParallel == 0);
  CHECK(l.paramPersistenceThreshold == 100);
  CHECK(l.modelPersistenceThreshold == -1);
  // Stored as given, so that the ranks read the same layout.
  CHECK(spec->toJson()["convert"]["layout"] ==
        nlohmann::json{{"ranks", 8}, {"zero_stage", 3}, {"stage3_param_persistence_threshold", 100}});
}

TEST_CASE("convert jobs: the section is read with its defaults - what does not fit is named", "[planner]") {
  auto spec = parseJobSpec(R"({"name": "c", "kind": "convert", "resources": {"ranks": 2},
    "convert": {"from": "/ckpt", "output": "/out"}})");
  INFO(spec.status().toString());
  REQUIRE(spec.isOk());
  CHECK(spec->convert.to == "hf");
  CHECK(spec->convert.dtype == "keep");
  CHECK(spec->convert.shardBytes == 5'000'000'000);
  auto again = parseJobSpec(spec->toJson().dump());
  REQUIRE(again.isOk());
  CHECK(again->toJson() == spec->toJson());
  auto sized = [](const std::string& size) {
    return R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
      "convert": {"from": "/ckpt", "output": "/out", "shard_size": )" + size + "}}";
  };
  CHECK(parseJobSpec(sized(R"("150KB")"))->convert.shardBytes == 150'000);
  CHECK(parseJobSpec(sized(R"("2GiB")"))->convert.shardBytes == int64_t(2) << 30);
  CHECK(parseJobSpec(sized("4096"))->convert.shardBytes == 4096);
  CHECK(errorOf(sized(R"("5 parsecs")")) ==
        "convert.shard_size: \"5 parsecs\" is not a size (a number and B, KB, MB, GB, TB, KiB, MiB or GiB)");
  CHECK(errorOf(sized("-1")) == "convert.shard_size: a size in bytes or a string such as \"5GB\"");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1}})") ==
        "convert: required for a convert job");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "dtype": "fp8"}})") ==
        "convert.dtype: \"fp8\" is not one of keep, fp32, bf16");
  CHECK(parseJobSpec(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "to": "deepspeed_universal"}})")->convert.to == "deepspeed_universal");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "to": "deepspeed_universal", "dtype": "bf16"}})") ==
        "convert.dtype: only a conversion to hf has a dtype (convert.to is deepspeed_universal)");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "to": "loom", "shard_size": "1GB", "layout": {"ranks": 2}}})") ==
        "convert.shard_size: only a conversion to hf is cut into shards (convert.to is loom)");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "to": "deepspeed_universal", "config": "/m/config.json"}})") ==
        "convert.config: only a conversion to loom reads the model's config (convert.to is deepspeed_universal)");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "to": "loom"}})") ==
        "convert.layout: a conversion to loom needs the layout to write for (at least its ranks)");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "layout": {"ranks": 2}}})") ==
        "convert.layout: only a conversion to loom has a layout (convert.to is hf)");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "to": "loom", "layout": {"ranks": 2, "zero_stage": 4}}})") ==
        "convert.layout.zero_stage: must be between 0 and 3, got 4");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"from": "/ckpt", "output": "/out", "to": "loom", "layout": {"ranks": 2, "pipeline": 2}}})") ==
        "convert.layout.pipeline: unknown key");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1},
    "convert": {"output": "/out"}})") == "convert.from: required field is missing");
  CHECK(errorOf(R"({"name": "c", "kind": "convert", "resources": {"ranks": 1}, "convert": {"from": "/c", "output": "/o"},
    "model": {"config": "/m"}})") == "model: does not apply to a convert job");
}

TEST_CASE("spec: a DeepSpeed config path over the API is refused, naming it", "[planner]") {
  const std::string spec = R"({"name": "p", "kind": "probe", "resources": {"ranks": 1}, "deepspeed": "ds.json"})";
  auto parsed = loom::planner::parseJobSpec(spec);
  REQUIRE_FALSE(parsed.isOk());
  CHECK(parsed.status().message().rfind("deepspeed: \"ds.json\" is a file path, which loomctl reads", 0) == 0);
}

namespace {

// A train job on rollout data with `data` and `train` keys added.
std::string rolloutTrain(const std::string& data, const std::string& train, const std::string& extra = "") {
  return R"({"name": "rl", "kind": "train", "resources": {"ranks": 1}, "model": {"config": "c.json"},
    "data": {"train": "results.jsonl", "seq_len": 64)" + data + R"(}, "train": {"steps": 2)" + train + "}" +
         (extra.empty() ? std::string(R"(, "deepspeed": {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})") : extra) + "}";
}

}  // namespace

TEST_CASE("training on rollout data: its format, rewards and losses", "[planner][post-training]") {
  using namespace loom::planner;
  auto pg = parseJobSpec(rolloutTrain(R"(, "format": "rollout", "reward": {"rule": "exact_match"})",
                                      R"(, "loss": {"type": "policy_gradient", "clip_ratio_high": 0.28,
                                         "advantage": "grpo_no_std"})"));
  REQUIRE(pg.isOk());
  CHECK(pg->data.format == DataFormat::kRollout);
  CHECK(pg->data.reward.kind == RewardRule::Kind::kExactMatch);
  CHECK(pg->train.loss.kind == LossSpec::Kind::kPolicyGradient);
  CHECK(pg->train.loss.clipRatioLow == 0.2);
  CHECK(pg->train.loss.clipRatioHigh == 0.28);
  CHECK(pg->train.loss.advantage == AdvantageKind::kGrpoNoStd);
  auto again = parseJobSpec(pg->toJson().dump());
  REQUIRE(again.isOk());
  CHECK(again->toJson() == pg->toJson());

  auto jsd = parseJobSpec(rolloutTrain(R"(, "format": "rollout")", R"(, "loss": {"type": "jsd", "teacher": "t",
                                       "beta": 0.1, "temperature": 2, "teacher_top_k": 20, "pointwise_clip": 5})"));
  REQUIRE(jsd.isOk());
  CHECK(jsd->train.loss.teacher == "t");
  CHECK(jsd->train.loss.beta == 0.1);
  CHECK(jsd->train.loss.teacherTopK == 20);
  CHECK(parseJobSpec(jsd->toJson().dump())->toJson() == jsd->toJson());
  auto sft = parseJobSpec(rolloutTrain(R"(, "format": "rollout", "rewards": "scores.jsonl",
                                       "reward": {"rule": "length", "target_tokens": 8})",
                                       ""));
  CHECK(sft.status().message() == "data.reward: give either a rule or data.rewards, a scorer's file, not both");
  auto length = parseJobSpec(rolloutTrain(R"(, "format": "rollout", "reward": {"rule": "length", "target_tokens": 8})",
                                          R"(, "loss": "cross_entropy")"));
  REQUIRE(length.isOk());
  CHECK(length->data.reward.targetTokens == 8);
  CHECK(length->train.loss.kind == LossSpec::Kind::kCrossEntropy);
}

TEST_CASE("training on rollout data: bad settings name the field", "[planner][post-training]") {
  CHECK(errorOf(rolloutTrain(R"(, "format": "jsonl")", "")) ==
        "data.format: \"jsonl\" is not one of tokens, rollout");
  CHECK(errorOf(rolloutTrain(R"(, "reward": {"rule": "exact_match"})", "")).find(
            "data.reward: scores rollout data; set data.format to \"rollout\"") == 0);
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout", "reward": {"rule": "bleu"})", "")) ==
        "data.reward.rule: \"bleu\" is not one of exact_match, length");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout", "reward": {"rule": "length"})", "")) ==
        "data.reward.target_tokens: required field is missing");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout", "pack_documents": true)", "")).find("data.pack_documents") == 0);
  CHECK(errorOf(rolloutTrain("", R"(, "loss": "policy_gradient")")) ==
        "train.loss: policy_gradient trains on response tokens: set data.format to \"rollout\" with data.train a "
        "rollout's results file");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout")", R"(, "loss": "dpo")")) ==
        "train.loss: \"dpo\" is not one of cross_entropy, policy_gradient, jsd");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout")", R"(, "loss": "jsd")")) ==
        "train.loss: jsd needs an object with its teacher");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout")", R"(, "loss": {"type": "jsd"})")) ==
        "train.loss.teacher: required field is missing");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout")", R"(, "loss": {"type": "jsd", "teacher": "t", "beta": 2})")) ==
        "train.loss.beta: must be between 0 and 1, got 2");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout")", R"(, "loss": {"type": "policy_gradient", "beta": 1})")) ==
        "train.loss.beta: unknown key");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout")",
                             R"(, "loss": {"type": "policy_gradient", "advantage": "gae"})")) ==
        "train.loss.advantage: \"gae\" is not one of grpo, grpo_no_std, reward, given");
  CHECK(errorOf(rolloutTrain(R"(, "format": "rollout", "reward": {"rule": "exact_match"})",
                             R"(, "loss": {"type": "policy_gradient", "advantage": "given"})"))
            .find("data.reward: train.loss.advantage is \"given\"") == 0);
  std::string sequenceParallel = rolloutTrain(R"(, "format": "rollout")", "", R"(, "deepspeed": {"train_batch_size": 4, "sequence_parallel_size": 2,
                                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
  sequenceParallel.replace(sequenceParallel.find("\"ranks\": 1"), 10, "\"ranks\": 2");
  CHECK(errorOf(sequenceParallel).find("deepspeed.sequence_parallel_size: 2: training on rollout data") == 0);
}

TEST_CASE("every section's error of a spec comes back at once, one per line", "[planner]") {
  const std::string message = errorOf(R"({"name": "a b", "kind": "train", "resources": {"ranks": 0},
    "model": {"config": "/m/config.json"}, "data": {"train": "/d.tokens", "seq_len": 8},
    "train": {"steps": 0}, "restart": {"max_restarts": -1}, "extra": 1,
    "deepspeed": {"use_data_before_expert_parallelism": true, "train_batch_size": 4, "optimizer": {"type": "AdamW"}}})");
  CHECK(message ==
        "6 problems:\n"
        "  name: may hold letters, digits, '-', '_' and '.' only, got \"a b\"\n"
        "  resources.ranks: must be between 1 and 65536, got 0\n"
        "  restart.max_restarts: must be between 0 and 1000, got -1\n"
        "  train.steps: must be between 1 and 1099511627776, got 0\n"
        "  deepspeed.use_data_before_expert_parallelism: true is not supported: not supported: experts see the data "
        "of their expert-parallel group (DeepSpeed's default)\n"
        "  extra: unknown key");
  // Without a kind there is no telling which sections apply: what is known so far.
  CHECK(errorOf(R"({"name": "a b", "kind": "serve", "resources": {"ranks": 0}})") ==
        "2 problems:\n  name: may hold letters, digits, '-', '_' and '.' only, got \"a b\"\n  kind: \"serve\" is not a "
        "job kind this version runs (supported: probe, train, eval, convert, rollout)");
}
