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

Result loomctl(const std::string& args, const std::string& dir) {
  std::string errPath = dir + "/loomctl.err";
  std::string cmd = binary("loomctl") + " " + args + " 2>" + errPath;
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
  rc = std::system(("LOOM_TORCH_RUNTIME=/nowhere/libloom_torch.so " + binary("loom-worker") + " --version >" + out +
                    " 2>&1")
                       .c_str());
  CHECK(WEXITSTATUS(rc) == 1);
  CHECK(files::readFile(out).value().find("/nowhere/libloom_torch.so") != std::string::npos);
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
