// loomctl as a person or a script uses it: output, exit codes, errors.
#include <cstdio>

#include <sys/wait.h>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/integration/cluster.h"

using namespace loom;
using namespace loom::testing;

namespace {

struct Result {
  int exitCode = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// `env`: more NAME=VALUE settings of loomctl's environment.
Result loomctl(const std::string& args, const std::string& dir, const std::string& env = "") {
  std::string errPath = dir + "/loomctl.err";
  // The credentials as a user's environment gives them.
  std::string cmd = "LOOM_TOKEN_FILE=" + testCredentials().adminTokenFile + " " + env + " " + binary("loomctl") + " " +
                    args + " 2>" + errPath;
  Result r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  int status = ::pclose(pipe);
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = files::readFile(errPath).value();
  return r;
}

std::string writeSpec(const TempDir& dir, const std::string& name, const std::string& spec) {
  std::string path = dir.path() + "/" + name;
  REQUIRE(files::writeFileAtomic(path, spec).isOk());
  return path;
}

}  // namespace

TEST_CASE("loomctl run: embedded control plane - exit code = job result", "[integration]") {
  TempDir dir;
  std::string spec = writeSpec(dir, "ok.json", probeSpec(2, 3, 10));
  Result ok = loomctl("run " + spec + " --state-dir " + dir.path() + "/state", dir.path());
  INFO(ok.err);
  CHECK(ok.exitCode == 0);
  CHECK(ok.err.find("SUCCEEDED") != std::string::npos);
  CHECK(ok.err.find("all 2 ranks exited 0") != std::string::npos);
}

TEST_CASE("loomctl validate names the field - submit prints the id alone - wait and get", "[integration]") {
  TempDir dir;
  Result missing = loomctl("validate " + dir.path() + "/absent.json", dir.path());
  CHECK(missing.exitCode == 2);
  CHECK(missing.err.find("absent.json") != std::string::npos);

  std::string bad = writeSpec(dir, "bad.json", probeSpec(2, 1, 1, {{"resources", {{"gpus", 8}}}}));
  Result invalid = loomctl("validate " + bad, dir.path());
  CHECK(invalid.exitCode == 2);
  CHECK(invalid.err.find("resources.gpus: unknown key") != std::string::npos);

  std::string good = writeSpec(dir, "good.json", probeSpec(2, 2, 10));
  Result valid = loomctl("validate " + good, dir.path());
  CHECK(valid.exitCode == 0);

  Standalone cluster(2);
  const std::string server = "--server " + cluster.address + " ";
  Result submitted = loomctl(server + "submit " + good, dir.path());
  REQUIRE(submitted.exitCode == 0);
  std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  CHECK(submitted.out == id + "\n");
  CHECK(id.rfind("probe-", 0) == 0);

  Result waited = loomctl(server + "wait " + id + " --timeout 60", dir.path());
  CHECK(waited.exitCode == 0);
  Result got = loomctl(server + "get " + id, dir.path());
  CHECK(got.exitCode == 0);
  CHECK(got.out.find("SUCCEEDED") != std::string::npos);
  Result json = loomctl(server + "-o json get " + id, dir.path());
  CHECK(nlohmann::json::parse(json.out)["state"] == "SUCCEEDED");
  Result listed = loomctl(server + "list", dir.path());
  CHECK(listed.out.find(id) != std::string::npos);
  Result logs = loomctl(server + "logs " + id + " --rank 1 --tail 1", dir.path());
  CHECK(logs.out == "rank 1: tick 2/2\n");
  Result nodes = loomctl(server + "nodes", dir.path());
  CHECK(nodes.out.find("node-a") != std::string::npos);
  Result unknown = loomctl(server + "get nope", dir.path());
  CHECK(unknown.exitCode == 4);
  CHECK(unknown.err.find("NOT_FOUND") != std::string::npos);
}

TEST_CASE("loomctl reads the DeepSpeed config file a spec names - auto values - errors name the file",
          "[integration]") {
  TempDir dir;
  REQUIRE(files::makeDirs(dir.path() + "/ds").isOk());
  // As HF Trainer users keep it: a file of its own, "auto" where the integration fills in.
  writeSpec(dir, "ds/ds_config.json", R"({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"},
      "steps_per_print": "auto", "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "overlap_comm": true}})");
  // Relative to the spec, wherever loomctl runs.
  const std::string named = writeSpec(dir, "named.json", probeSpec(2, 1, 1, {{"deepspeed", "ds/ds_config.json"}}));
  Result unfilled = loomctl("validate " + named, "/");
  CHECK(unfilled.exitCode == 2);
  CHECK(unfilled.err.find("give a value for deepspeed.steps_per_print") != std::string::npos);
  // DeepSpeed's own sections take their default for "auto": reduce_bucket_size is not asked for.
  CHECK(unfilled.err.find("reduce_bucket_size") == std::string::npos);
  writeSpec(dir, "ds/ds_config.json", R"({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"},
      "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "overlap_comm": true}})");
  Result valid = loomctl("validate " + named, "/");
  INFO(valid.err);
  CHECK(valid.exitCode == 0);

  const std::string absent = writeSpec(dir, "absent.json", probeSpec(2, 1, 1, {{"deepspeed", "ds/nope.json"}}));
  Result missing = loomctl("validate " + absent, dir.path());
  CHECK(missing.exitCode == 2);
  CHECK(missing.err.find("deepspeed: cannot open " + dir.path() + "/ds/nope.json") != std::string::npos);
  writeSpec(dir, "ds/broken.json", "{\"train_batch_size\": ");
  const std::string broken = writeSpec(dir, "broken.json", probeSpec(2, 1, 1, {{"deepspeed", "ds/broken.json"}}));
  Result invalid = loomctl("validate " + broken, dir.path());
  CHECK(invalid.exitCode == 2);
  CHECK(invalid.err.find("deepspeed: " + dir.path() + "/ds/broken.json is not valid JSON") != std::string::npos);
}

TEST_CASE("loomctl cancel - then wait exits 3 for the cancelled job", "[integration]") {
  TempDir dir;
  Standalone cluster(1);
  std::string spec = writeSpec(dir, "long.json", probeSpec(1, 1000, 50));
  Result submitted = loomctl("--server " + cluster.address + " submit " + spec, dir.path());
  std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  awaitRunning(*cluster.client, id);
  Result cancelled = loomctl("--server " + cluster.address + " cancel " + id, dir.path());
  CHECK(cancelled.exitCode == 0);
  Result waited = loomctl("--server " + cluster.address + " wait " + id, dir.path());
  CHECK(waited.exitCode == 3);
  CHECK(waited.out.find("CANCELLED") != std::string::npos);
}

TEST_CASE("loom-worker --version loads its libtorch runtime - a wrong path is named", "[integration]") {
  TempDir dir;
  std::string out = dir.path() + "/out";
  int rc = std::system((binary("loom-worker") + " --version >" + out + " 2>&1").c_str());
  CHECK(WEXITSTATUS(rc) == 0);
  CHECK(files::readFile(out).value().find("torch 2.11.0") != std::string::npos);
  CHECK(files::readFile(out).value().find("reference [cpu, libtorch]") != std::string::npos);
  // Plugins on LOOM_KERNEL_PATH are listed with the ops they take.
  rc = std::system(("LOOM_KERNEL_PATH=" + std::string(LOOM_BIN_DIR) + "/../lib/libloom_kernels_cpu.so " +
                    binary("loom-worker") + " --version >" + out + " 2>&1")
                       .c_str());
  CHECK(WEXITSTATUS(rc) == 0);
  CHECK(files::readFile(out).value().find("libloom_kernels_cpu.so") != std::string::npos);
  rc = std::system(("LOOM_TORCH_RUNTIME=/nowhere/libloom_torch.so " + binary("loom-worker") + " --version >" + out +
                    " 2>&1")
                       .c_str());
  CHECK(WEXITSTATUS(rc) == 1);
  CHECK(files::readFile(out).value().find("/nowhere/libloom_torch.so") != std::string::npos);
}

TEST_CASE("loom-worker reads its plan through libloom_worker_proto.so - a corrupt plan, a wrong path are named",
          "[integration]") {
  TempDir dir;
  nlohmann::json spec{{"name", "planned"},
                      {"kind", "train"},
                      {"resources", {{"ranks", 1}}},
                      {"model", {{"config", "config.json"}}},
                      {"data", {{"train", "train.tokens"}, {"seq_len", 16}}},
                      {"train", {{"steps", 1}}},
                      {"deepspeed", {{"train_micro_batch_size_per_gpu", 1}, {"optimizer", {{"type", "AdamW"}}}}}};
  writeSpec(dir, "plan.pb", "not a plan");
  // A rank's environment as loomd sets it; nothing listens on the report socket, and the plan is
  // read before the rank reports.
  const std::string rank = "LOOM_JOB_ID=j1 LOOM_ATTEMPT=1 RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 "
                           "MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 LOOM_HEARTBEAT_MS=1000 LOOM_SPEC=" +
                           writeSpec(dir, "job.json", spec.dump()) + " LOOM_RANK_DIR=" + dir.path() +
                           " LOOM_REPORT_SOCKET=" + dir.path() + "/none.sock LOOM_PLAN=" + dir.path() + "/plan.pb ";
  const std::string out = dir.path() + "/out";
  int rc = std::system((rank + binary("loom-worker") + " >" + out + " 2>&1").c_str());
  CHECK(WEXITSTATUS(rc) == 1);
  CHECK(files::readFile(out).value().find("plan: " + dir.path() + "/plan.pb: not a loom.v1.Plan") !=
        std::string::npos);
  rc = std::system((rank + "LOOM_WORKER_PROTO=/nowhere/libloom_worker_proto.so " + binary("loom-worker") + " >" + out +
                    " 2>&1")
                       .c_str());
  CHECK(WEXITSTATUS(rc) == 1);
  CHECK(files::readFile(out).value().find("cannot load the plan reader: /nowhere/libloom_worker_proto.so") !=
        std::string::npos);
}

TEST_CASE("loomctl data prepare writes a token file - a bad input is named with its line", "[integration]") {
  TempDir dir;
  std::string fortunes = writeSpec(dir, "fortunes", "one\n%\ntwo\n");
  std::string out = dir.path() + "/fortunes.tokens";
  Result ok = loomctl("data prepare " + fortunes + " --separator % --output " + out, dir.path());
  INFO(ok.err);
  CHECK(ok.exitCode == 0);
  CHECK(ok.out == "2 documents, 10 tokens, vocab size 257 (bytes tokenizer) -> " + out + "\n");
  std::string raw = files::readFile(out).value();
  REQUIRE(raw.size() > 16);
  CHECK(raw.substr(0, 8) == "LOOMTOK1");
  size_t headerBytes = 0;
  for (int i = 0; i < 8; ++i) headerBytes |= size_t{static_cast<unsigned char>(raw[8 + i])} << (8 * i);
  auto header = nlohmann::json::parse(raw.substr(16, headerBytes));
  CHECK(header["num_tokens"] == 10);
  CHECK(header["document_starts"] == nlohmann::json::array({0, 5}));
  CHECK(raw.size() == (16 + headerBytes + 63) / 64 * 64 + 10 * 2);

  std::string jsonl = writeSpec(dir, "docs.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  Result json = loomctl("-o json data prepare " + jsonl + " --output " + dir.path() + "/docs.tokens", dir.path());
  CHECK(json.exitCode == 2);
  CHECK(json.err == "loomctl: INVALID_ARGUMENT: " + jsonl + ":2: key \"text\" is missing\n");
  CHECK_FALSE(files::exists(dir.path() + "/docs.tokens"));
  std::string bodies = writeSpec(dir, "bodies.jsonl", "{\"body\": \"b\"}\n{\"body\": \"\u00e9\"}\n");
  json = loomctl("-o json data prepare " + bodies + " --text-key body --output " + dir.path() + "/docs.tokens",
                 dir.path());
  INFO(json.err);
  REQUIRE(json.exitCode == 0);
  auto summary = nlohmann::json::parse(json.out);
  CHECK(summary["documents"] == 2);
  CHECK(summary["tokens"] == 5);  // "b" and the two bytes of "é", each + EOS
  CHECK(summary["output"] == dir.path() + "/docs.tokens");
  CHECK(files::exists(dir.path() + "/docs.tokens"));

  Result missing = loomctl("data prepare " + dir.path() + "/absent.txt --output " + out, dir.path());
  CHECK(missing.exitCode == 2);
  CHECK(missing.err.find(dir.path() + "/absent.txt: no such file") != std::string::npos);
}

TEST_CASE("loomctl plan prints mesh - groups - layers - memory - or the whole plan - exit 2 with the reason",
          "[integration]") {
  TempDir dir;
  writeSpec(dir, "config.json", R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8})");
  nlohmann::json spec{{"name", "llama8b"},
                      {"kind", "train"},
                      {"resources", {{"ranks", 64}, {"device", "cuda"}}},
                      {"model", {{"config", "config.json"}}},  // relative to the spec file
                      {"data", {{"train", "train.tokens"}, {"seq_len", 8192}}},
                      {"train", {{"steps", 100}}},
                      {"deepspeed",
                       {{"train_micro_batch_size_per_gpu", 1},
                        {"optimizer", {{"type", "AdamW"}}},
                        {"bf16", {{"enabled", true}}},
                        {"zero_optimization", {{"stage", 3}}},
                        {"tensor_parallel", {{"autotp_size", 8}}}}}};
  const std::string file = writeSpec(dir, "job.json", spec.dump());
  Result human = loomctl("plan " + file, dir.path());
  INFO(human.err);
  CHECK(human.exitCode == 0);
  CHECK(human.out.find("Mesh:      64 ranks = dp 8 x sp 1 x tp 8; experts over ep 1") != std::string::npos);
  CHECK(human.out.find("tensor           8 of 8     [0-7] [8-15] ... [56-63]") != std::string::npos);
  CHECK(human.out.find("4 of 32 query heads per rank") != std::string::npos);
  CHECK(human.out.find("a rank keeps 125,734,912 of the 1,004,015,616 elements of its shard") != std::string::npos);
  CHECK(human.out.find("RANKS     PARAMETERS") != std::string::npos);

  Result json = loomctl("plan " + file + " --world 16 -o json", dir.path());
  INFO(json.err);
  REQUIRE(json.exitCode == 0);
  auto plan = nlohmann::json::parse(json.out);
  CHECK(plan["mesh"]["world"] == 16);
  CHECK(plan["mesh"]["dp"] == 2);
  CHECK(plan["parameters"].size() == 291);  // embedding, 32 x 9, norm, head
  CHECK(plan["parameters"][2]["name"] == "model.layers.0.self_attn.q_proj.weight");
  CHECK(plan["parameters"][2]["local_shape"] == nlohmann::json{"512", "4096"});  // int64 as JSON strings

  Result uneven = loomctl("plan " + file + " --world 12", dir.path());
  CHECK(uneven.exitCode == 2);
  CHECK(uneven.err.find("resources.ranks 12 cannot be split into deepspeed.tensor_parallel.autotp_size 8") != std::string::npos);
  spec["deepspeed"]["tensor_parallel"]["autotp_size"] = 3;
  spec["resources"]["ranks"] = 3;
  Result heads = loomctl("plan " + writeSpec(dir, "tp3.json", spec.dump()), dir.path());
  CHECK(heads.exitCode == 2);
  CHECK(heads.err.find("tensor parallel 3: num_attention_heads 32 is not a multiple of it") != std::string::npos);
  spec["model"]["config"] = "absent.json";
  Result absent = loomctl("plan " + writeSpec(dir, "absent.json.spec", spec.dump()), dir.path());
  CHECK(absent.exitCode == 2);
  CHECK(absent.err.find("model.config: cannot open " + dir.path() + "/absent.json") != std::string::npos);
  Result probe = loomctl("plan " + writeSpec(dir, "probe.json", probeSpec(2, 1, 1)), dir.path());
  CHECK(probe.exitCode == 2);
  CHECK(probe.err.find("a probe job has no plan") != std::string::npos);
  // validate compiles too: what submit would refuse, it refuses.
  spec["model"]["config"] = "config.json";
  spec["deepspeed"].erase("tensor_parallel");
  spec["resources"]["ranks"] = 1;
  Result tooBig = loomctl("validate " + writeSpec(dir, "one.json", spec.dump()), dir.path());
  CHECK(tooBig.exitCode == 2);
  CHECK(tooBig.err.find("resources.device_memory_gb 80: estimated") != std::string::npos);
}

TEST_CASE("loomctl kernels lists a plugin's ops - a file that is not a plugin is named", "[integration]") {
  TempDir dir;
  const std::string cpuPlugin = std::string(LOOM_BIN_DIR) + "/../lib/libloom_kernels_cpu.so";
  Result listed = loomctl("kernels " + cpuPlugin, dir.path());
  INFO(listed.err);
  CHECK(listed.exitCode == 0);
  CHECK(listed.out.find("loom-cpu [cpu, ") != std::string::npos);
  CHECK(listed.out.find("22 of 22 ops") != std::string::npos);
  CHECK(listed.out.find("rms_norm_forward") != std::string::npos);

  // The spec's kernels.plugins are names, looked up in the kernel directories (LOOM_KERNEL_DIRS).
  REQUIRE(files::writeFileAtomic(dir.path() + "/libloom_kernels_fake.so", "not a shared library").isOk());
  std::string spec = writeSpec(dir, "job.json", probeSpec(1, 1, 1, {{"kernels", {{"plugins", {"fake"}}}}}));
  Result bad = loomctl("kernels --spec " + spec, dir.path(), "LOOM_KERNEL_DIRS=" + dir.path());
  CHECK(bad.exitCode != 0);
  CHECK(bad.err.find(dir.path() + "/libloom_kernels_fake.so") != std::string::npos);
  Result elsewhere = loomctl("kernels --spec " + spec, dir.path());
  CHECK(elsewhere.exitCode == 4);
  CHECK(elsewhere.err.find("kernel plugin \"fake\" (libloom_kernels_fake.so) is in none of this node's kernel "
                           "directories") != std::string::npos);
  std::string path = writeSpec(dir, "path.json",
                               probeSpec(1, 1, 1, {{"kernels", {{"plugins", {dir.path() + "/libloom_kernels_fake.so"}}}}}));
  Result refused = loomctl("kernels --spec " + path, dir.path());
  CHECK(refused.exitCode == 2);
  CHECK(refused.err.find("kernels.plugins[0]: \"" + dir.path() + "/libloom_kernels_fake.so\" is not a plugin name") !=
        std::string::npos);

  Result missing = loomctl("kernels " + dir.path() + "/absent.so", dir.path());
  CHECK(missing.exitCode == 4);
  CHECK(missing.err.find("absent.so (from the command line or --spec) does not exist") != std::string::npos);
}
