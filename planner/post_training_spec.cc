#include "planner/post_training_spec.h"

#include <array>
#include <utility>

#include "planner/json_reader.h"

namespace loom::planner {

using nlohmann::json;

namespace {

template <typename Enum, size_t N>
StatusOr<Enum> named(const std::array<std::pair<const char*, Enum>, N>& names, const std::string& value,
                     const std::string& field) {
  std::string all;
  for (const auto& [name, kind] : names) {
    if (value == name) return kind;
    all += (all.empty() ? "" : ", ") + std::string(name);
  }
  return invalidArgument("{}: \"{}\" is not one of {}", field, value, all);
}

template <typename Enum, size_t N>
const char* nameOf(const std::array<std::pair<const char*, Enum>, N>& names, Enum kind) {
  for (const auto& [name, k] : names)
    if (k == kind) return name;
  return "?";
}

constexpr std::array<std::pair<const char*, DataFormat>, 2> kFormats{
    {{"tokens", DataFormat::kTokens}, {"rollout", DataFormat::kRollout}}};
constexpr std::array<std::pair<const char*, RewardRule::Kind>, 2> kRules{
    {{"exact_match", RewardRule::Kind::kExactMatch}, {"length", RewardRule::Kind::kLength}}};
constexpr std::array<std::pair<const char*, LossSpec::Kind>, 3> kLosses{
    {{"cross_entropy", LossSpec::Kind::kCrossEntropy},
     {"policy_gradient", LossSpec::Kind::kPolicyGradient},
     {"jsd", LossSpec::Kind::kJsd}}};
constexpr std::array<std::pair<const char*, AdvantageKind>, 4> kAdvantages{
    {{"grpo", AdvantageKind::kGrpo},
     {"grpo_no_std", AdvantageKind::kGrpoNoStd},
     {"reward", AdvantageKind::kReward},
     {"given", AdvantageKind::kGiven}}};

}  // namespace

const char* lossKindName(LossSpec::Kind kind) { return nameOf(kLosses, kind); }
const char* advantageKindName(AdvantageKind kind) { return nameOf(kAdvantages, kind); }

StatusOr<DataFormat> parseDataFormat(const json& value) {
  if (!value.is_string()) return invalidArgument("data.format: must be \"tokens\" or \"rollout\", got {}", value.dump());
  return named(kFormats, value.get<std::string>(), "data.format");
}

StatusOr<RewardRule> parseRewardRule(const json& value) {
  if (!value.is_object()) return invalidArgument("data.reward: must be an object such as {{\"rule\": \"exact_match\"}}");
  ObjectReader r(value, "data.reward");
  std::string rule;
  RETURN_IF_ERROR(r.readString("rule", &rule, /*required=*/true));
  RewardRule out;
  ASSIGN_OR_RETURN(out.kind, named(kRules, rule, "data.reward.rule"));
  RETURN_IF_ERROR(r.readInt("target_tokens", &out.targetTokens, out.kind == RewardRule::Kind::kLength, 1, 1 << 24));
  if (out.kind != RewardRule::Kind::kLength && out.targetTokens)
    return invalidArgument("data.reward.target_tokens: applies to the length rule only");
  RETURN_IF_ERROR(r.rejectUnknown());
  return out;
}

StatusOr<LossSpec> parseLossSpec(const json& value) {
  LossSpec out;
  if (value.is_string()) {
    ASSIGN_OR_RETURN(out.kind, named(kLosses, value.get<std::string>(), "train.loss"));
    if (out.kind == LossSpec::Kind::kJsd) return invalidArgument("train.loss: jsd needs an object with its teacher");
    return out;
  }
  if (!value.is_object())
    return invalidArgument("train.loss: must be a loss name or an object with \"type\", got {}", value.dump());
  ObjectReader r(value, "train.loss");
  std::string type;
  RETURN_IF_ERROR(r.readString("type", &type, /*required=*/true));
  ASSIGN_OR_RETURN(out.kind, named(kLosses, type, "train.loss.type"));
  if (out.kind == LossSpec::Kind::kPolicyGradient) {
    RETURN_IF_ERROR(r.readDouble("clip_ratio_low", &out.clipRatioLow, false, 0, 1));
    RETURN_IF_ERROR(r.readDouble("clip_ratio_high", &out.clipRatioHigh, false, 0, 1e6));
    std::string advantage = advantageKindName(out.advantage);
    RETURN_IF_ERROR(r.readString("advantage", &advantage, false));
    ASSIGN_OR_RETURN(out.advantage, named(kAdvantages, advantage, "train.loss.advantage"));
  }
  if (out.kind == LossSpec::Kind::kJsd) {
    RETURN_IF_ERROR(r.readString("teacher", &out.teacher, /*required=*/true));
    RETURN_IF_ERROR(r.readDouble("beta", &out.beta, false, 0, 1));
    RETURN_IF_ERROR(r.readDouble("temperature", &out.temperature, false, 1e-6, 1e6));
    RETURN_IF_ERROR(r.readInt("teacher_top_k", &out.teacherTopK, false, 1, int64_t(1) << 30));
    RETURN_IF_ERROR(r.readDouble("pointwise_clip", &out.pointwiseClip, false, 0, 1e30));
  }
  RETURN_IF_ERROR(r.rejectUnknown());
  return out;
}

json rewardRuleToJson(const RewardRule& rule) {
  json j{{"rule", nameOf(kRules, rule.kind)}};
  if (rule.kind == RewardRule::Kind::kLength) j["target_tokens"] = rule.targetTokens;
  return j;
}

json lossSpecToJson(const LossSpec& loss) {
  json j{{"type", lossKindName(loss.kind)}};
  if (loss.kind == LossSpec::Kind::kPolicyGradient) {
    j["clip_ratio_low"] = loss.clipRatioLow;
    j["clip_ratio_high"] = loss.clipRatioHigh;
    j["advantage"] = advantageKindName(loss.advantage);
  }
  if (loss.kind == LossSpec::Kind::kJsd) {
    j["teacher"] = loss.teacher;
    j["beta"] = loss.beta;
    j["temperature"] = loss.temperature;
    if (loss.teacherTopK > 0) j["teacher_top_k"] = loss.teacherTopK;
    if (loss.pointwiseClip >= 0) j["pointwise_clip"] = loss.pointwiseClip;
  }
  return j;
}

}  // namespace loom::planner
