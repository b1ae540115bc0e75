#include "worker/rollout/response_samples.h"

#include <cmath>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "common/json_lines.h"
#include "planner/json_reader.h"

namespace loom::rollout {

using nlohmann::json;

namespace {

StatusOr<std::string> sampleId(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  return invalidArgument("id: must be a string or an integer, got {}", j.dump());
}

StatusOr<std::vector<int64_t>> tokenIds(const json& j, const char* key, int64_t vocabSize) {
  if (!j.is_array()) return invalidArgument("{}: must be a list of token ids", key);
  std::vector<int64_t> out;
  for (const json& id : j) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocabSize)
      return invalidArgument("{}: {} is not a token id of the model's vocabulary (0 to {})", key, id.dump(),
                             vocabSize - 1);
    out.push_back(id.get<int64_t>());
  }
  return out;
}

StatusOr<std::vector<float>> numbers(const json& j, const char* key, size_t count) {
  if (!j.is_array() || j.size() != count)
    return invalidArgument("{}: must be a list of {} numbers, one per response token (token_ids)", key, count);
  std::vector<float> out;
  for (const json& x : j) {
    if (!x.is_number()) return invalidArgument("{}: {} is not a number", key, x.dump());
    out.push_back(x.get<float>());
  }
  return out;
}

// The scores a line may carry, from the results file or a scorer's file.
Status readScores(const json& j, ResponseSample& s) {
  planner::ObjectReader r(j, "");
  if (const json* reward = r.find("reward")) {
    if (!reward->is_number()) return invalidArgument("reward: must be a number, got {}", reward->dump());
    s.reward = reward->get<double>();
  }
  if (const json* advantage = r.find("advantage")) {
    if (!advantage->is_number()) return invalidArgument("advantage: must be a number, got {}", advantage->dump());
    s.advantage = advantage->get<double>();
  }
  if (const json* advantages = r.find("advantages")) {
    ASSIGN_OR_RETURN(s.advantages, numbers(*advantages, "advantages", s.responseTokenIds.size()));
  }
  return Status::ok();
}

std::string key(const std::string& id, int sample) { return fmt::format("{}#{}", id, sample); }

std::string trimmed(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

// Whether the answer is the reference: text against text, or token ids against token ids where
// an end token (eos, a stop token) that finished the sample is left out.
StatusOr<bool> exactMatch(const ResponseSample& s) {
  if (s.reference.is_string()) {
    if (!s.text)
      return invalidArgument("reference: a text reference needs the sample's text; run the rollout with "
                             "rollout.tokenizer, or give the reference as token ids");
    return trimmed(*s.text) == trimmed(s.reference.get<std::string>());
  }
  if (!s.reference.is_array())
    return invalidArgument("reference: the exact_match rule needs text or a list of token ids, got {}",
                           s.reference.is_null() ? std::string("none") : s.reference.dump());
  std::vector<int64_t> want;
  for (const json& id : s.reference) {
    if (!id.is_number_integer()) return invalidArgument("reference: {} is not a token id", id.dump());
    want.push_back(id.get<int64_t>());
  }
  const std::vector<int64_t>& got = s.responseTokenIds;
  if (got == want) return true;
  const bool ended = s.finishReason == "eos" || s.finishReason == "stop";
  return ended && !got.empty() && std::vector<int64_t>(got.begin(), got.end() - 1) == want;
}

}  // namespace

StatusOr<std::vector<ResponseSample>> readResponseSamples(const std::string& path, int64_t vocabSize,
                                                          int64_t seqLen) {
  std::vector<ResponseSample> samples;
  std::set<std::string> seen;
  RETURN_IF_ERROR(forEachJsonLine(path, "data.train", [&](const json& j, int64_t number) -> Status {
    if (!j.is_object()) return invalidArgument("must be a JSON object, got {}", j.type_name());
    planner::ObjectReader r(j, "");
    ResponseSample s;
    s.line = number;
    s.id = std::to_string(number);
    if (const json* id = r.find("id")) {
      ASSIGN_OR_RETURN(s.id, sampleId(*id));
    }
    int64_t sample = 0;
    RETURN_IF_ERROR(r.readInt("sample", &sample, false, 0, 1 << 20));
    s.sample = static_cast<int>(sample);
    const json* prompt = r.find("prompt_token_ids");
    const json* response = r.find("token_ids");
    if (!prompt || !response)
      return invalidArgument("needs prompt_token_ids and token_ids (a rollout's results line), missing {}",
                             prompt ? "token_ids" : "prompt_token_ids");
    ASSIGN_OR_RETURN(s.promptTokenIds, tokenIds(*prompt, "prompt_token_ids", vocabSize));
    ASSIGN_OR_RETURN(s.responseTokenIds, tokenIds(*response, "token_ids", vocabSize));
    if (s.promptTokenIds.empty()) return invalidArgument("prompt_token_ids: empty; a response needs a prompt before it");
    if (s.tokens() > seqLen + 1)
      return invalidArgument("holds {} tokens (prompt {} + response {}); data.seq_len {} trains on at most {}: raise "
                             "data.seq_len",
                             s.tokens(), s.promptTokenIds.size(), s.responseTokenIds.size(), seqLen, seqLen + 1);
    if (const json* logprobs = r.find("logprobs"); logprobs && !logprobs->empty()) {
      ASSIGN_OR_RETURN(s.behaviourLogprobs, numbers(*logprobs, "logprobs", s.responseTokenIds.size()));
    }
    if (const json* text = r.find("text"); text && text->is_string()) s.text = text->get<std::string>();
    RETURN_IF_ERROR(r.readString("finish_reason", &s.finishReason, false));
    if (const json* reference = r.find("reference")) s.reference = *reference;
    RETURN_IF_ERROR(readScores(j, s));
    if (!seen.insert(key(s.id, s.sample)).second)
      return invalidArgument("id \"{}\" sample {} is on an earlier line too", s.id, s.sample);
    samples.push_back(std::move(s));
    return Status::ok();
  }));
  if (samples.empty()) return invalidArgument("data.train: {} holds no sample", path);
  return samples;
}

Status applyScoresFile(std::vector<ResponseSample>& samples, const std::string& path) {
  std::map<std::string, ResponseSample*> byKey;
  for (ResponseSample& s : samples) byKey[key(s.id, s.sample)] = &s;
  return forEachJsonLine(path, "data.rewards", [&](const json& j, int64_t) -> Status {
    if (!j.is_object() || !j.contains("id")) return invalidArgument("must be an object with the sample's id");
    ASSIGN_OR_RETURN(const std::string id, sampleId(j.at("id")));
    const int sample = j.value("sample", 0);
    auto found = byKey.find(key(id, sample));
    if (found == byKey.end()) return invalidArgument("id \"{}\" sample {} is not a sample of data.train", id, sample);
    return readScores(j, *found->second);
  });
}

Status applyRewardRule(std::vector<ResponseSample>& samples, const planner::RewardRule& rule) {
  using Kind = planner::RewardRule::Kind;
  for (ResponseSample& s : samples) {
    if (rule.kind == Kind::kExactMatch) {
      auto match = exactMatch(s);
      if (!match.isOk()) return match.status().withContext(fmt::format("data.reward exact_match: data.train line {}", s.line));
      s.reward = *match ? 1.0 : 0.0;
    } else if (rule.kind == Kind::kLength) {
      const double target = static_cast<double>(rule.targetTokens);
      s.reward = std::max(0.0, 1.0 - std::abs(static_cast<double>(s.responseTokenIds.size()) - target) / target);
    }
  }
  return Status::ok();
}

Status assignAdvantages(std::vector<ResponseSample>& samples, planner::AdvantageKind kind) {
  using planner::AdvantageKind;
  auto missing = [](const ResponseSample& s, const char* what) {
    return invalidArgument("data.train line {} (id \"{}\" sample {}): has no {}; score it with data.reward or "
                           "data.rewards, or put it in the line",
                           s.line, s.id, s.sample, what);
  };
  // GRPO's baseline: the mean reward of the samples of the same prompt, and their spread.
  std::map<std::string, std::vector<double>> groups;
  for (const ResponseSample& s : samples) {
    if (kind != AdvantageKind::kGiven && !s.reward) return missing(s, "reward");
    if (kind != AdvantageKind::kGiven) groups[s.id].push_back(*s.reward);
  }
  std::map<std::string, std::pair<double, double>> baseline;  // mean, std
  for (const auto& [id, rewards] : groups) {
    const double n = static_cast<double>(rewards.size());
    double mean = 0, sq = 0;
    for (double r : rewards) mean += r / n;
    for (double r : rewards) sq += (r - mean) * (r - mean);
    // A prompt sampled once has no baseline: its reward stands (verl does the same).
    baseline[id] = rewards.size() > 1 ? std::make_pair(mean, std::sqrt(sq / (n - 1))) : std::make_pair(0.0, 1.0);
  }
  for (ResponseSample& s : samples) {
    const size_t tokens = s.responseTokenIds.size();
    if (kind == AdvantageKind::kGiven) {
      if (!s.advantages.empty()) continue;
      if (!s.advantage) return missing(s, "advantage or advantages");
      s.advantages.assign(tokens, static_cast<float>(*s.advantage));
      continue;
    }
    const auto [mean, std] = baseline.at(s.id);
    double a = *s.reward;
    if (kind == AdvantageKind::kGrpo) a = (a - mean) / (std + 1e-6);
    if (kind == AdvantageKind::kGrpoNoStd) a = a - mean;
    s.advantages.assign(tokens, static_cast<float>(a));
  }
  return Status::ok();
}

double meanReward(const std::vector<ResponseSample>& samples) {
  double sum = 0;
  int64_t count = 0;
  for (const ResponseSample& s : samples)
    if (s.reward) sum += *s.reward, ++count;
  return count ? sum / static_cast<double>(count) : 0.0;
}

}  // namespace loom::rollout
