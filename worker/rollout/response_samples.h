#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/post_training_spec.h"

namespace loom::rollout {

// One line of a rollout's results file (results_file.h) as a training sample: the prompt, the
// response that is trained on, and what scores it. A user's scorer may add "reward" (per
// sample), "advantage" (per sample) or "advantages" (per response token) to the lines, or write
// them to a file of their own (data.rewards).
struct ResponseSample {
  std::string id;
  int sample = 0;
  int64_t line = 0;  // in data.train, from 1
  std::vector<int64_t> promptTokenIds, responseTokenIds;
  std::vector<float> behaviourLogprobs;  // the rollout's logprob of each response token; empty: none
  std::optional<std::string> text;
  std::string finishReason;
  nlohmann::json reference;  // null: none
  std::optional<double> reward;
  std::optional<double> advantage;
  std::vector<float> advantages;  // per response token; filled for every sample by assignAdvantages

  int64_t tokens() const { return static_cast<int64_t>(promptTokenIds.size() + responseTokenIds.size()); }
};

// Reads data.train's lines, every one checked before training starts: the prompt and response
// token ids (below `vocabSize`), logprobs one per response token, a unique (id, sample), at most
// seq_len + 1 tokens, and the scores' types. Errors name the file and the line.
StatusOr<std::vector<ResponseSample>> readResponseSamples(const std::string& path, int64_t vocabSize, int64_t seqLen);

// data.rewards: lines {"id", "sample", and "reward", "advantage" or "advantages"}, each naming a
// sample of data.train, laid over what its line holds.
Status applyScoresFile(std::vector<ResponseSample>& samples, const std::string& path);

// data.reward: the rule scores every sample against its reference (a sample without one is an
// error naming its line).
Status applyRewardRule(std::vector<ResponseSample>& samples, const planner::RewardRule& rule);

// Each sample's per-token advantages, as the estimator says (planner::AdvantageKind): from the
// rewards, grouped by id for GRPO, or the given ones. A sample without what it needs is an error
// naming its line.
Status assignAdvantages(std::vector<ResponseSample>& samples, planner::AdvantageKind kind);

// The mean reward of the samples that have one (0 when none has).
double meanReward(const std::vector<ResponseSample>& samples);

}  // namespace loom::rollout
