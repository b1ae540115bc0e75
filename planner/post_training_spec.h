#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::planner {

// Training on what a rollout produced (docs/post-training.md): the data, how each sample is
// scored, and the loss over its response tokens.

// data.format: what data.train holds. tokens: a token file (worker/data/token_file.h); rollout: a
// rollout's results file (JSONL, worker/rollout/response_samples.h), each line a sample whose
// response tokens alone are trained on.
enum class DataFormat { kTokens, kRollout };

// data.reward: a rule that scores each sample of rollout data against its line's "reference".
//   exact_match: 1 when the answer equals the reference (text, whitespace-trimmed, or token ids,
//                the end token left out), else 0;
//   length:      1 - |response tokens - target_tokens| / target_tokens, at least 0.
struct RewardRule {
  enum class Kind { kNone, kExactMatch, kLength };
  Kind kind = Kind::kNone;
  int64_t targetTokens = 0;
};

// How a policy-gradient loss turns rewards into each sample's advantage:
//   grpo:        (r - mean) / (std + 1e-6) over the samples of the same prompt (GRPO; std unbiased),
//   grpo_no_std: r - mean over the same prompt's samples (Dr. GRPO),
//   reward:      the reward itself (REINFORCE),
//   given:       the lines' own "advantage" (per sample) or "advantages" (per response token).
enum class AdvantageKind { kGrpo, kGrpoNoStd, kReward, kGiven };

// train.loss: "cross_entropy" (the default), or an object with "type" and the type's keys.
//   cross_entropy:   next-token cross entropy over the labels (on rollout data, the response's);
//   policy_gradient: PPO's clipped surrogate over response tokens: ratio = exp(logp - the
//                    behaviour policy's logp, the line's "logprobs"), loss per token
//                    max(-A ratio, -A clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high));
//   jsd:             DeepSpeed 0.19.8's OPSD generalized JSD (runtime/rollout/opsd.py) between this
//                    model's and a teacher's next-token distributions over response tokens, the
//                    teacher (HF weights of the same config) run in the same job.
// Every loss is the sum over the step's response tokens divided by their number over all ranks
// and micro-batches of the step, as DeepSpeed aggregates OPSD's unreduced sums.
struct LossSpec {
  enum class Kind { kCrossEntropy, kPolicyGradient, kJsd };
  Kind kind = Kind::kCrossEntropy;
  // policy_gradient
  double clipRatioLow = 0.2;
  double clipRatioHigh = 0.2;
  AdvantageKind advantage = AdvantageKind::kGrpo;
  // jsd
  std::string teacher;
  double beta = 0.5;
  double temperature = 1.0;
  int64_t teacherTopK = 0;     // 0: the whole vocabulary
  double pointwiseClip = -1;   // < 0: none
};

const char* lossKindName(LossSpec::Kind kind);
const char* advantageKindName(AdvantageKind kind);

// data.format's value, data.reward's object and train.loss's value, each error naming its field.
StatusOr<DataFormat> parseDataFormat(const nlohmann::json& value);
StatusOr<RewardRule> parseRewardRule(const nlohmann::json& value);
StatusOr<LossSpec> parseLossSpec(const nlohmann::json& value);
nlohmann::json rewardRuleToJson(const RewardRule& rule);
nlohmann::json lossSpecToJson(const LossSpec& loss);

}  // namespace loom::planner
