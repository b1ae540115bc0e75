// Train and eval jobs end to end: real loomd, real ranks, a small Llama on real text.
#include <signal.h>

#include <cmath>
#include <fstream>
#include <regex>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/integration/cluster.h"
#include "worker/data/prepare.h"

using namespace loom;
using namespace loom::testing;
using nlohmann::json;

namespace {

// A 2-layer Llama (GQA, untied head) and token files from the licence texts Debian ships.
struct TrainingFiles {
  TempDir dir;
  std::string config, train, eval;

  TrainingFiles() {
    config = dir.path() + "/config.json";
    REQUIRE(files::writeFileAtomic(config, R"({"model_type": "llama", "vocab_size": 260, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5})").isOk());
    train = dir.path() + "/train.tokens";
    eval = dir.path() + "/eval.tokens";
    REQUIRE(data::prepareTokenFile({.inputs = {"/usr/share/common-licenses/GPL-3"}, .output = train}).isOk());
    REQUIRE(data::prepareTokenFile({.inputs = {"/usr/share/common-licenses/LGPL-2.1"}, .output = eval}).isOk());
  }

  json trainSpec(const std::string& name, int ranks, int steps, const std::string& checkpointDir = "") const {
    json spec{{"name", name},
              {"kind", "train"},
              {"resources", {{"ranks", ranks}}},
              {"model", {{"config", config}, {"init_seed", 7}}},
              {"data", {{"train", train}, {"eval", eval}, {"seq_len", 32}, {"seed", 3}}},
              {"train", {{"steps", steps}}},
              {"deepspeed",
               {{"train_batch_size", 8},
                {"train_micro_batch_size_per_gpu", 2},
                {"steps_per_print", 1},
                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
                {"scheduler",
                 {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4}, {"warmup_max_lr", 3e-3}}}}}}}};
    if (!checkpointDir.empty()) spec["train"]["checkpoint_dir"] = checkpointDir;
    return spec;
  }
};

std::string rankLog(client::LoomClient& client, const std::string& jobId, int rank, int attempt = 0) {
  v1::GetJobLogsRequest request;
  request.set_job_id(jobId);
  request.add_ranks(rank);
  request.set_attempt(attempt);
  std::string out;
  REQUIRE(client.streamLogs(request, [&](const v1::LogChunk& c) {
                  out += c.data();
                  return true;
                }).isOk());
  return out;
}

// "step 3/12: loss 5.1234 ..." lines of a rank-0 log, by step.
std::map<int, double> losses(const std::string& log) {
  std::map<int, double> out;
  static const std::regex line(R"(step (\d+)/\d+: loss ([0-9.]+))");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it)
    out[std::stoi((*it)[1])] = std::stod((*it)[2]);
  return out;
}

v1::Job runToEnd(Standalone& cluster, const json& spec) {
  auto created = cluster.client->createJob(spec.dump());
  INFO(created.status().toString());
  REQUIRE(created.isOk());
  return awaitFinal(*cluster.client, created->job().id(), std::chrono::seconds(100));
}

}  // namespace

TEST_CASE("train: 2 data-parallel ranks reproduce the 1-rank losses - and the loss falls", "[integration][train]") {
  TrainingFiles f;
  Standalone cluster(2);
  v1::Job one = runToEnd(cluster, f.trainSpec("one", 1, 12));
  json twoSpec = f.trainSpec("two", 2, 12, f.dir.path() + "/ckpt");
  twoSpec["train"]["profile_step"] = 5;  // profiling one step changes nothing in the run
  v1::Job two = runToEnd(cluster, twoSpec);
  INFO(one.reason() << " / " << two.reason());
  REQUIRE(one.state() == v1::SUCCEEDED);
  REQUIRE(two.state() == v1::SUCCEEDED);
  auto a = losses(rankLog(*cluster.client, one.id(), 0));
  const std::string twoLog = rankLog(*cluster.client, two.id(), 0);
  auto b = losses(twoLog);
  // train.profile_step: the profiled step's report in rank 0's log, the operators by time.
  CHECK(twoLog.find("profile of step 5 (train.profile_step):") != std::string::npos);
  CHECK(std::regex_search(twoLog, std::regex(R"(\| aten::\w+ \| [0-9.]+ \| [0-9.]+% \|)")));
  REQUIRE(a.size() == 12);
  REQUIRE(b.size() == 12);
  // Same samples per step, gradient mean over ranks = mean over micro-batches: equal up to
  // float reordering (the log prints 4 decimals).
  for (int s = 1; s <= 12; ++s) CHECK(std::abs(a[s] - b[s]) <= 1e-4);
  CHECK(a[12] < a[1] - 0.5);
  // The job's metrics are rank 0's latest.
  CHECK(two.metrics().at("loss") == Approx(b[12]).margin(1e-4));
  CHECK(two.metrics().count("tokens_per_s"));

  // The checkpoint at the end: published, with a manifest, and `latest` names it.
  auto latest = files::readFile(f.dir.path() + "/ckpt/latest");
  REQUIRE(latest.isOk());
  CHECK(*latest == "global_step12\n");
  const std::string tag = f.dir.path() + "/ckpt/global_step12";
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "config.json",
                           "rank_00000.safetensors", "rank_00001.safetensors", "manifest.json"})
    CHECK(files::exists(tag + "/" + file));
  auto manifest = json::parse(*files::readFile(tag + "/manifest.json"));
  CHECK(manifest["files"].size() == 6);
}

namespace {

// Runs `spec` (checkpointing every 10 steps, one restart allowed), SIGKILLs rank `victim` once the
// first checkpoint is published, and checks that the restarted attempt resumed from a checkpoint
// and logged `expected`'s losses from there to `steps`. Returns the step it resumed at.
int killAndResume(Standalone& cluster, json spec, int victim, const std::string& checkpointDir, int steps,
                  const std::map<int, double>& expected) {
  spec["train"]["checkpoint_every"] = 10;
  spec["restart"] = {{"max_restarts", 1}};
  auto created = cluster.client->createJob(spec.dump());
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(*cluster.client, created->job().id());
  REQUIRE(eventually([&] { return files::exists(checkpointDir + "/latest"); }, std::chrono::seconds(60)));
  REQUIRE(::kill(running.ranks(victim).pid(), SIGKILL) == 0);

  v1::Job job = awaitFinal(*cluster.client, created->job().id(), std::chrono::seconds(100));
  INFO(job.reason());
  REQUIRE(job.state() == v1::SUCCEEDED);
  REQUIRE(job.restarts() == 1);
  const std::string second = rankLog(*cluster.client, job.id(), 0, 2);
  std::smatch m;
  REQUIRE(std::regex_search(second, m, std::regex(R"(resumed from \S+/global_step(\d+) at step (\d+))")));
  const int resumedAt = std::stoi(m[2]);
  CHECK(resumedAt % 10 == 0);
  CHECK(resumedAt < steps);
  auto after = losses(second);
  REQUIRE(after.size() == static_cast<size_t>(steps - resumedAt));
  // Model, optimizer, schedule and data position all came back: the same losses as the run
  // that was never interrupted.
  for (const auto& [step, loss] : after) CHECK(std::abs(loss - expected.at(step)) <= 1e-4);
  return resumedAt;
}

}  // namespace

TEST_CASE("train: a rank killed mid-run - the restarted attempt resumes from the checkpoint and ends as an "
          "uninterrupted run does",
          "[integration][train]") {
  TrainingFiles f;
  Standalone cluster(2);
  const int steps = 150;
  v1::Job clean = runToEnd(cluster, f.trainSpec("clean", 2, steps));
  REQUIRE(clean.state() == v1::SUCCEEDED);
  killAndResume(cluster, f.trainSpec("resumed", 2, steps, f.dir.path() + "/ckpt"), 1, f.dir.path() + "/ckpt", steps,
                losses(rankLog(*cluster.client, clean.id(), 0)));
}

TEST_CASE("train: tp2 x dp2 - a rank killed mid-run - the restarted attempt resumes and ends with the "
          "uninterrupted run's weights",
          "[integration][train]") {
  TrainingFiles f;
  Standalone cluster(4);
  const int steps = 60;
  auto tensorParallel = [&](json spec) {
    spec["deepspeed"]["tensor_parallel"] = {{"autotp_size", 2}};
    spec["deepspeed"]["zero_optimization"] = {{"stage", 1}};
    return spec;
  };
  v1::Job clean = runToEnd(cluster, tensorParallel(f.trainSpec("clean", 4, steps, f.dir.path() + "/clean")));
  REQUIRE(clean.state() == v1::SUCCEEDED);
  killAndResume(cluster, tensorParallel(f.trainSpec("resumed", 4, steps, f.dir.path() + "/ckpt")), 3,
                f.dir.path() + "/ckpt", steps, losses(rankLog(*cluster.client, clean.id(), 0)));
  // Each rank's pieces and optimizer state came back: the whole weights are those of the run that
  // was never interrupted, byte for byte.
  const std::string tag = "/global_step" + std::to_string(steps) + "/model.safetensors";
  auto a = files::readFile(f.dir.path() + "/clean" + tag), b = files::readFile(f.dir.path() + "/ckpt" + tag);
  REQUIRE(a.isOk());
  REQUIRE(b.isOk());
  CHECK(*a == *b);
}

TEST_CASE("train: bf16 follows the fp32 run within bf16 tolerance", "[integration][train]") {
  TrainingFiles f;
  Standalone cluster(2);
  json bf16 = f.trainSpec("bf16", 2, 12);
  bf16["deepspeed"]["bf16"] = {{"enabled", true}};
  v1::Job fp32Job = runToEnd(cluster, f.trainSpec("fp32", 2, 12));
  v1::Job bf16Job = runToEnd(cluster, bf16);
  REQUIRE(fp32Job.state() == v1::SUCCEEDED);
  REQUIRE(bf16Job.state() == v1::SUCCEEDED);
  auto a = losses(rankLog(*cluster.client, fp32Job.id(), 0));
  auto b = losses(rankLog(*cluster.client, bf16Job.id(), 0));
  REQUIRE(b.size() == 12);
  // fp32 master weights and optimizer state: bf16 rounding only in the forward and backward.
  for (int s = 1; s <= 12; ++s) CHECK(std::abs(a[s] - b[s]) <= 0.05);
  CHECK(b[12] < b[1] - 0.5);
}

TEST_CASE("train: fp16 overflows are skipped and counted - and the loss scale backs off", "[integration][train]") {
  TrainingFiles f;
  Standalone cluster(2);
  json spec = f.trainSpec("fp16", 2, 24);
  // 2^24 overflows this model's fp16 gradients at once; without hysteresis each overflow halves
  // the scale, until it fits.
  spec["deepspeed"]["fp16"] = {{"enabled", true}, {"initial_scale_power", 24}, {"hysteresis", 1}};
  v1::Job job = runToEnd(cluster, spec);
  INFO(job.reason());
  REQUIRE(job.state() == v1::SUCCEEDED);
  const double skipped = job.metrics().at("skipped_steps");
  CHECK(skipped >= 1);
  CHECK(skipped < 12);
  CHECK(job.metrics().at("loss_scale") == std::ldexp(1.0, 24 - static_cast<int>(skipped)));
  const std::string log = rankLog(*cluster.client, job.id(), 0);
  CHECK(log.find("step 1: fp16 gradients overflow at loss scale 1.67772e+07: step skipped") != std::string::npos);
  // Steps after the back-off train: the loss moves.
  auto l = losses(log);
  CHECK(l[24] < l[1] - 0.3);
}

TEST_CASE("eval: mean loss and per-token logprobs of a trained checkpoint", "[integration][train]") {
  TrainingFiles f;
  Standalone cluster(2);
  REQUIRE(runToEnd(cluster, f.trainSpec("t", 2, 4, f.dir.path() + "/ckpt")).state() == v1::SUCCEEDED);
  const std::string out = f.dir.path() + "/logprobs.safetensors";
  json spec{{"name", "e"},
            {"kind", "eval"},
            {"resources", {{"ranks", 2}}},
            {"model", {{"config", f.config}, {"weights", f.dir.path() + "/ckpt/global_step4"}}},
            {"data", {{"eval", f.eval}, {"seq_len", 32}}},
            {"eval", {{"max_batches", 3}, {"logprobs_output", out}}},
            {"deepspeed", {{"train_micro_batch_size_per_gpu", 2}}}};
  v1::Job job = runToEnd(cluster, spec);
  INFO(job.reason());
  REQUIRE(job.state() == v1::SUCCEEDED);
  CHECK(job.metrics().at("eval_loss") > 0);
  CHECK(job.metrics().at("eval_tokens") == 3 * 2 * 2 * 32);
  // 12 samples x 32 tokens of fp32, after the safetensors header.
  auto bytes = files::readFile(out);
  REQUIRE(bytes.isOk());
  CHECK(bytes->size() > 12 * 32 * 4);
  CHECK(rankLog(*cluster.client, job.id(), 0).find("eval: per-token values [12, 32] written to") != std::string::npos);
}

TEST_CASE("train: bad inputs fail the job with a reason naming the field and the file", "[integration][train]") {
  TrainingFiles f;
  Standalone cluster(1);
  SECTION("a token file whose vocabulary does not fit the model") {
    REQUIRE(files::writeFileAtomic(f.config, R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4})").isOk());
    v1::Job job = runToEnd(cluster, f.trainSpec("vocab", 1, 2));
    CHECK(job.state() == v1::FAILED);
    CHECK(job.reason().find("data.train: " + f.train + " has vocab_size 257, above the model's vocab_size 100") !=
          std::string::npos);
  }
  SECTION("weights missing a tensor") {
    // A checkpoint of a 2-layer model given to a 3-layer config.
    REQUIRE(runToEnd(cluster, f.trainSpec("t", 1, 1, f.dir.path() + "/ckpt")).state() == v1::SUCCEEDED);
    REQUIRE(files::writeFileAtomic(f.config, R"({"model_type": "llama", "vocab_size": 260, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2})")
                .isOk());
    json spec = f.trainSpec("weights", 1, 2);
    spec["model"]["weights"] = f.dir.path() + "/ckpt/global_step1";
    v1::Job job = runToEnd(cluster, spec);
    CHECK(job.state() == v1::FAILED);
    CHECK(job.reason().find("model.weights: " + f.dir.path() + "/ckpt/global_step1: tensor "
                            "model.layers.2.input_layernorm.weight is missing") != std::string::npos);
  }
  SECTION("a ZeRO checkpoint resumed at another stage or size is refused, naming both and the convert job to run") {
    const std::string ckpt = f.dir.path() + "/ckpt";
    json zero2 = f.trainSpec("z2", 1, 2, ckpt);
    zero2["deepspeed"]["zero_optimization"] = {{"stage", 2}};
    REQUIRE(runToEnd(cluster, zero2).state() == v1::SUCCEEDED);
    json zero1 = f.trainSpec("z1", 1, 4, ckpt);
    zero1["deepspeed"]["zero_optimization"] = {{"stage", 1}};
    v1::Job job = runToEnd(cluster, zero1);
    CHECK(job.state() == v1::FAILED);
    CHECK(job.reason().find("global_step2: written at ZeRO stage 2, tensor parallel 1 x 1 data-parallel ranks; this job "
                            "runs stage 1, tensor parallel 1 x 1") != std::string::npos);
    CHECK(job.reason().find(R"("convert":{"from":")" + ckpt + R"(","layout":{"autotp_size":1,"ranks":1,)"
                            R"("sequence_parallel_size":1,"zero_stage":1},"output":")" + ckpt + R"(-1ranks-zero1","to":"loom"})") !=
          std::string::npos);
  }
  SECTION("a corrupt checkpoint is refused, not resumed from") {
    const std::string ckpt = f.dir.path() + "/ckpt";
    REQUIRE(runToEnd(cluster, f.trainSpec("t", 1, 2, ckpt)).state() == v1::SUCCEEDED);
    {
      std::fstream model(ckpt + "/global_step2/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      model.seekp(-4, std::ios::end);
      model.write("oops", 4);
    }
    v1::Job job = runToEnd(cluster, f.trainSpec("resume", 1, 4, ckpt));
    CHECK(job.state() == v1::FAILED);
    CHECK(job.reason().find("global_step2/optimizer.safetensors: CRC-32 does not match the manifest") !=
          std::string::npos);
    // Nothing already stored was touched: the checkpoint is still there as it was.
    CHECK(*files::readFile(ckpt + "/latest") == "global_step2\n");
  }
}
