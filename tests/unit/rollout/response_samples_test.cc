#include "worker/rollout/response_samples.h"

#include <cmath>
#include <fstream>

#include "tests/catch.h"
#include "tests/temp_dir.h"
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

std::string errorOf(const TempDir& dir, const std::string& text, int64_t seqLen = 16) {
  auto samples = readResponseSamples(write(dir, "r.jsonl", text), /*vocabSize=*/50, seqLen);
  return samples.isOk() ? "" : samples.status().message();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("rollout results read back as training samples", "[rollout][post-training]") {
  TempDir dir;
  std::vector<SampleResult> results(2);
  results[0] = {.id = "q", .order = 1, .sample = 0, .promptTokenIds = {1, 2}, .tokenIds = {7, 8}, .text = "ab",
                .logprobs = {-0.5f, -1.5f}, .topLogprobs = {}, .finishReason = "eos"};
  results[0].reference = "ab";
  results[1] = {.id = "q", .order = 1, .sample = 1, .promptTokenIds = {1, 2}, .tokenIds = {9}, .text = "c",
                .logprobs = {-2.0f}, .topLogprobs = {}, .finishReason = "length"};
  const std::string path = dir.path() + "/out.jsonl";
  REQUIRE(writeResultsFile(path, results).isOk());
  auto samples = readResponseSamples(path, 50, 8);
  REQUIRE(samples.isOk());
  REQUIRE(samples->size() == 2);
  const ResponseSample& a = (*samples)[0];
  CHECK(a.id == "q");
  CHECK(a.line == 1);
  CHECK(a.promptTokenIds == std::vector<int64_t>{1, 2});
  CHECK(a.responseTokenIds == std::vector<int64_t>{7, 8});
  CHECK(a.behaviourLogprobs == std::vector<float>{-0.5f, -1.5f});
  CHECK(a.finishReason == "eos");
  CHECK(a.reference == "ab");
  CHECK(!a.reward);
  CHECK((*samples)[1].sample == 1);
  CHECK((*samples)[1].reference.is_null());
}

TEST_CASE("rollout samples: every bad line is refused with its line and field named", "[rollout][post-training]") {
  TempDir dir;
  CHECK(contains(errorOf(dir, "{\"prompt_token_ids\": [1]}\n"), "line 1: needs prompt_token_ids and token_ids"));
  CHECK(contains(errorOf(dir, "{\"prompt_token_ids\": [1], \"token_ids\": [50]}\n"),
                 "token_ids: 50 is not a token id of the model's vocabulary (0 to 49)"));
  CHECK(contains(errorOf(dir, "\n{\"prompt_token_ids\": [1], \"token_ids\": [2], \"logprobs\": [0, 1]}\n"),
                 "line 2: logprobs: must be a list of 1 numbers"));
  CHECK(contains(errorOf(dir, "{\"prompt_token_ids\": [1, 2, 3], \"token_ids\": [2, 3]}\n", 3),
                 "holds 5 tokens (prompt 3 + response 2); data.seq_len 3 trains on at most 4"));
  CHECK(contains(errorOf(dir, "{\"id\": 1, \"prompt_token_ids\": [1], \"token_ids\": [2]}\n"
                              "{\"id\": \"1\", \"prompt_token_ids\": [1], \"token_ids\": [3]}\n"),
                 "line 2: id \"1\" sample 0 is on an earlier line too"));
  CHECK(contains(errorOf(dir, "{\"prompt_token_ids\": [], \"token_ids\": [3]}\n"), "prompt_token_ids: empty"));
  CHECK(contains(errorOf(dir, "{\"prompt_token_ids\": [1], \"token_ids\": [3], \"reward\": \"high\"}\n"),
                 "reward: must be a number"));
  CHECK(contains(errorOf(dir, "not json\n"), "data.train: " + dir.path() + "/r.jsonl line 1: not valid JSON"));
  CHECK(contains(errorOf(dir, "\n"), "holds no sample"));
}

TEST_CASE("reward rules: exact match on text or token ids, and length", "[rollout][post-training]") {
  TempDir dir;
  auto samples = readResponseSamples(
      write(dir, "r.jsonl",
            "{\"id\": \"a\", \"prompt_token_ids\": [1], \"token_ids\": [5, 2], \"finish_reason\": \"eos\", "
            "\"reference\": [5]}\n"
            "{\"id\": \"a\", \"sample\": 1, \"prompt_token_ids\": [1], \"token_ids\": [5, 2], \"finish_reason\": "
            "\"length\", \"reference\": [5]}\n"
            "{\"id\": \"b\", \"prompt_token_ids\": [1], \"token_ids\": [6], \"text\": \" Paris \", \"reference\": "
            "\"Paris\"}\n"),
      50, 8);
  REQUIRE(samples.isOk());
  REQUIRE(applyRewardRule(*samples, {.kind = planner::RewardRule::Kind::kExactMatch}).isOk());
  CHECK(*(*samples)[0].reward == 1.0);  // the eos that ended it is not part of the answer
  CHECK(*(*samples)[1].reward == 0.0);  // cut by length: [5, 2] is not [5]
  CHECK(*(*samples)[2].reward == 1.0);
  REQUIRE(applyRewardRule(*samples, {.kind = planner::RewardRule::Kind::kLength, .targetTokens = 4}).isOk());
  CHECK(*(*samples)[0].reward == 0.5);
  CHECK(*(*samples)[2].reward == 0.25);

  auto noReference = readResponseSamples(write(dir, "n.jsonl", "{\"prompt_token_ids\": [1], \"token_ids\": [5]}\n"),
                                         50, 8);
  REQUIRE(noReference.isOk());
  const Status s = applyRewardRule(*noReference, {.kind = planner::RewardRule::Kind::kExactMatch});
  CHECK(contains(s.message(), "data.reward exact_match: data.train line 1: reference"));
  auto textless = readResponseSamples(
      write(dir, "t.jsonl", "{\"prompt_token_ids\": [1], \"token_ids\": [5], \"reference\": \"x\"}\n"), 50, 8);
  CHECK(contains(applyRewardRule(*textless, {.kind = planner::RewardRule::Kind::kExactMatch}).message(),
                 "rollout.tokenizer"));
}

TEST_CASE("advantages: GRPO over each prompt's samples, Dr. GRPO, the reward, or given", "[rollout][post-training]") {
  TempDir dir;
  const std::string path = write(dir, "r.jsonl",
                                 "{\"id\": \"a\", \"prompt_token_ids\": [1], \"token_ids\": [5, 6], \"reward\": 1}\n"
                                 "{\"id\": \"a\", \"sample\": 1, \"prompt_token_ids\": [1], \"token_ids\": [5], "
                                 "\"reward\": 0}\n"
                                 "{\"id\": \"a\", \"sample\": 2, \"prompt_token_ids\": [1], \"token_ids\": [5], "
                                 "\"reward\": 0}\n"
                                 "{\"id\": \"b\", \"prompt_token_ids\": [1], \"token_ids\": [7], \"reward\": 0.5}\n");
  auto samples = readResponseSamples(path, 50, 8);
  REQUIRE(samples.isOk());
  REQUIRE(assignAdvantages(*samples, planner::AdvantageKind::kGrpo).isOk());
  // Group a: mean 1/3, unbiased std sqrt(1/3).
  const double std = std::sqrt(1.0 / 3.0);
  CHECK((*samples)[0].advantages.size() == 2);
  CHECK(std::abs((*samples)[0].advantages[1] - (2.0 / 3.0) / (std + 1e-6)) < 1e-6);
  CHECK(std::abs((*samples)[1].advantages[0] - (-1.0 / 3.0) / (std + 1e-6)) < 1e-6);
  // A prompt sampled once keeps its reward.
  CHECK(std::abs((*samples)[3].advantages[0] - 0.5 / (1 + 1e-6)) < 1e-6);
  CHECK(meanReward(*samples) == Approx(0.375));

  auto noStd = readResponseSamples(path, 50, 8);
  REQUIRE(assignAdvantages(*noStd, planner::AdvantageKind::kGrpoNoStd).isOk());
  CHECK(std::abs((*noStd)[0].advantages[0] - 2.0 / 3.0) < 1e-6);
  auto reward = readResponseSamples(path, 50, 8);
  REQUIRE(assignAdvantages(*reward, planner::AdvantageKind::kReward).isOk());
  CHECK((*reward)[3].advantages[0] == 0.5f);
  auto unadvantaged = readResponseSamples(path, 50, 8);
  CHECK(contains(assignAdvantages(*unadvantaged, planner::AdvantageKind::kGiven).message(),
                 "has no advantage or advantages"));

  auto unscored = readResponseSamples(write(dir, "u.jsonl", "{\"prompt_token_ids\": [1], \"token_ids\": [5]}\n"), 50, 8);
  CHECK(contains(assignAdvantages(*unscored, planner::AdvantageKind::kGrpo).message(),
                 "data.train line 1 (id \"1\" sample 0): has no reward"));
}

TEST_CASE("a scorer's file lays rewards and advantages over the samples", "[rollout][post-training]") {
  TempDir dir;
  auto samples = readResponseSamples(write(dir, "r.jsonl",
                                           "{\"id\": \"a\", \"prompt_token_ids\": [1], \"token_ids\": [5, 6]}\n"
                                           "{\"id\": 7, \"prompt_token_ids\": [1], \"token_ids\": [5]}\n"),
                                     50, 8);
  REQUIRE(samples.isOk());
  REQUIRE(applyScoresFile(*samples, write(dir, "s.jsonl",
                                          "{\"id\": \"a\", \"reward\": 2, \"advantages\": [0.5, -0.5]}\n"
                                          "{\"id\": 7, \"sample\": 0, \"advantage\": 3}\n"))
              .isOk());
  CHECK(*(*samples)[0].reward == 2.0);
  REQUIRE(assignAdvantages(*samples, planner::AdvantageKind::kGiven).isOk());
  CHECK((*samples)[0].advantages == std::vector<float>{0.5f, -0.5f});
  CHECK((*samples)[1].advantages == std::vector<float>{3.0f});
  const Status unknown = applyScoresFile(*samples, write(dir, "x.jsonl", "{\"id\": \"z\", \"reward\": 1}\n"));
  CHECK(contains(unknown.message(), "data.rewards: " + dir.path() + "/x.jsonl line 1: id \"z\" sample 0 is not a "
                                    "sample of data.train"));
  const Status wrongCount = applyScoresFile(*samples, write(dir, "w.jsonl", "{\"id\": \"a\", \"advantages\": [1]}\n"));
  CHECK(contains(wrongCount.message(), "advantages: must be a list of 2 numbers"));
}
