#include "worker/rollout/prompts_file.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"
#include "worker/rollout/generation_config.h"
#include "worker/rollout/results_file.h"

using namespace loom;
using namespace loom::rollout;
using loom::testing::TempDir;

namespace {

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string errorOf(const TempDir& dir, const std::string& text) {
  auto lines = readPromptsFile(write(dir, "p.jsonl", text), planner::SamplingParams{});
  return lines.isOk() ? "" : lines.status().message();
}

}  // namespace

TEST_CASE("prompts file: text or token ids, ids from the line number, sampling over the defaults", "[rollout]") {
  TempDir dir;
  planner::SamplingParams defaults{.temperature = 0.5, .maxNewTokens = 7};
  auto lines = readPromptsFile(write(dir, "p.jsonl",
                                     "{\"prompt\": \"hi\"}\n\n"
                                     "{\"id\": \"q\", \"prompt_token_ids\": [1, 2], \"sampling\": {\"n\": 3}}\n"
                                     "{\"id\": 9, \"prompt_token_ids\": [4], \"sampling\": {\"max_tokens\": 2}, "
                                     "\"arrival_s\": 0.5}\n"),
                               defaults);
  REQUIRE(lines.isOk());
  REQUIRE(lines->size() == 3);
  CHECK((*lines)[0].id == "1");
  CHECK((*lines)[0].isText);
  CHECK((*lines)[0].sampling.temperature == 0.5);
  CHECK((*lines)[1].id == "q");
  CHECK((*lines)[1].line == 3);
  CHECK((*lines)[1].tokenIds == std::vector<int64_t>{1, 2});
  CHECK((*lines)[1].sampling.n == 3);
  CHECK((*lines)[1].sampling.maxNewTokens == 7);
  CHECK((*lines)[2].id == "9");
  CHECK((*lines)[2].sampling.maxNewTokens == 2);
  CHECK((*lines)[2].arrivalS == 0.5);
  CHECK((*lines)[0].arrivalS == 0);
}

TEST_CASE("prompts file: every bad line is refused, naming the file and the line", "[rollout]") {
  TempDir dir;
  CHECK(errorOf(dir, "{\"prompt\": \"a\"}\n{not json\n").find("line 2: not valid JSON") != std::string::npos);
  CHECK(errorOf(dir, "{\"prompt\": \"a\", \"prompt_token_ids\": [1]}\n").find("line 1: needs one of prompt") !=
        std::string::npos);
  CHECK(errorOf(dir, "{\"id\": \"x\"}\n").find("needs one of prompt") != std::string::npos);
  CHECK(errorOf(dir, "{\"prompt_token_ids\": [1, -2]}\n").find("prompt_token_ids: -2 is not a token id") !=
        std::string::npos);
  CHECK(errorOf(dir, "{\"prompt\": 5}\n").find("prompt: must be text") != std::string::npos);
  CHECK(errorOf(dir, "{\"prompt\": \"a\", \"temperature\": 1}\n").find("line 1: temperature: unknown key") !=
        std::string::npos);
  CHECK(errorOf(dir, "{\"prompt\": \"a\", \"sampling\": {\"top_k\": -2}}\n").find("sampling.top_k") != std::string::npos);
  CHECK(errorOf(dir, "{\"prompt\": \"a\", \"sampling\": {\"max_tokens\": 2, \"max_new_tokens\": 3}}\n")
            .find("not both") != std::string::npos);
  CHECK(errorOf(dir, "{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"a\", \"prompt\": \"y\"}\n")
            .find("line 2: id: \"a\" is used by an earlier line") != std::string::npos);
  CHECK(errorOf(dir, "\n  \n").find("holds no prompt") != std::string::npos);
  CHECK(errorOf(dir, "{\"prompt\": \"a\", \"arrival_s\": -1}\n").find("line 1: arrival_s") != std::string::npos);
  auto missing = readPromptsFile(dir.path() + "/absent.jsonl", {});
  CHECK(missing.status().message().find("rollout.prompts") == 0);
}

TEST_CASE("results file: one line per sample in prompts-file order, written whole", "[rollout]") {
  TempDir dir;
  std::vector<SampleResult> results(3);
  results[0] = {.id = "b", .order = 2, .sample = 0, .promptTokenIds = {3}, .tokenIds = {5}, .text = std::nullopt,
                .logprobs = {-0.5f}, .topLogprobs = {}, .finishReason = "length"};
  results[1] = {.id = "a", .order = 1, .sample = 1, .promptTokenIds = {1, 2}, .tokenIds = {7, 8}, .text = "hi",
                .logprobs = {-1, -2}, .topLogprobs = {{{7, -1.0f}}, {{8, -2.0f}}}, .finishReason = "stop"};
  results[2] = {.id = "a", .order = 1, .sample = 0, .promptTokenIds = {1, 2}, .tokenIds = {9}, .text = "x",
                .logprobs = {-3}, .topLogprobs = {}, .finishReason = "eos"};
  const std::string path = dir.path() + "/out.jsonl";
  REQUIRE(writeResultsFile(path, results).isOk());
  const std::string text = *files::readFile(path);
  std::vector<nlohmann::json> lines;
  for (size_t begin = 0, end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1)
    lines.push_back(nlohmann::json::parse(text.substr(begin, end - begin)));
  REQUIRE(lines.size() == 3);
  CHECK(lines[0]["id"] == "a");
  CHECK(lines[0]["sample"] == 0);
  CHECK(lines[1]["sample"] == 1);
  CHECK(lines[1]["top_logprobs"][1][0]["token_id"] == 8);
  CHECK(lines[2]["id"] == "b");
  CHECK(!lines[2].contains("text"));
  CHECK(lines[2]["prompt_token_ids"] == nlohmann::json::array({3}));
  CHECK(lines[2]["prompt_tokens"] == 1);
  CHECK(writeResultsFile(dir.path() + "/no/such/dir/out.jsonl", results).message().find("rollout.output") == 0);
}

TEST_CASE("end-of-sequence ids: generation_config.json first, then config.json", "[rollout]") {
  TempDir dir;
  const std::string config = write(dir, "config.json", R"({"eos_token_id": 2})");
  CHECK(*readEosTokenIds(config) == std::vector<int64_t>{2});
  write(dir, "generation_config.json", R"({"eos_token_id": [128001, 128009]})");
  CHECK(*readEosTokenIds(config) == std::vector<int64_t>{128001, 128009});
  write(dir, "generation_config.json", R"({"eos_token_id": "x"})");
  CHECK(readEosTokenIds(config).status().message().find("eos_token_id") != std::string::npos);
  TempDir none;
  CHECK(readEosTokenIds(write(none, "config.json", "{}"))->empty());
}
