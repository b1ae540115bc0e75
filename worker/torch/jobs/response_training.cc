#include "worker/torch/jobs/response_training.h"

#include <set>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "worker/torch/data/response_batch.h"
#include "worker/torch/jobs/response_losses.h"
#include "worker/torch/model/model_setup.h"

namespace loom::worker {

using planner::LossSpec;

StatusOr<std::unique_ptr<ResponseTraining>> ResponseTraining::create(RankSetup& rank, const DecoderModel& model) {
  const planner::JobSpec& spec = rank.spec;
  ASSIGN_OR_RETURN(std::vector<rollout::ResponseSample> samples,
                   rollout::readResponseSamples(spec.data.train, model.config().vocabSize, spec.data.seqLen));
  if (!spec.data.rewards.empty()) RETURN_IF_ERROR(rollout::applyScoresFile(samples, spec.data.rewards));
  if (spec.data.reward.kind != planner::RewardRule::Kind::kNone)
    RETURN_IF_ERROR(rollout::applyRewardRule(samples, spec.data.reward));
  const LossSpec& loss = spec.train.loss;
  if (loss.kind == LossSpec::Kind::kPolicyGradient)
    RETURN_IF_ERROR(rollout::assignAdvantages(samples, loss.advantage));
  std::unique_ptr<ResponseTraining> out(new ResponseTraining(spec, std::move(samples)));
  for (const rollout::ResponseSample& s : out->samples_) out->scored_ = out->scored_ || s.reward.has_value();
  out->meanReward_ = rollout::meanReward(out->samples_);
  if (loss.kind == LossSpec::Kind::kJsd) {
    if (loss.teacherTopK > 0 && model.tensorParallel().size() > 1)
      return invalidArgument("train.loss.teacher_top_k: the teacher's top-k entries are taken over the whole "
                             "vocabulary, which tensor parallelism {} splits; leave it out or train at autotp_size 1",
                             model.tensorParallel().size());
    if (loss.teacherTopK > model.config().vocabSize)
      return invalidArgument("train.loss.teacher_top_k: {} exceeds the vocabulary ({})", loss.teacherTopK,
                             model.config().vocabSize);
    // The same config and layout as the model, its own weights; never trained.
    planner::JobSpec teacherSpec = spec;
    teacherSpec.model.weights = loss.teacher;
    auto teacher = buildModel(teacherSpec, rank.local, rank.device, rank.mesh);
    if (!teacher.isOk()) return teacher.status().withContext("train.loss.teacher");
    out->teacher_ = std::move(teacher->model);
    for (const auto& [name, p] : out->teacher_->parameters()) p.requires_grad_(false);
  }
  return out;
}

int64_t ResponseTraining::responseTokens(const std::vector<int64_t>& samples) const {
  int64_t n = 0;
  for (int64_t i : samples) n += static_cast<int64_t>(samples_[i].responseTokenIds.size());
  return n;
}

int64_t ResponseTraining::inputTokens(const std::vector<int64_t>& samples) const {
  int64_t n = 0;
  for (int64_t i : samples) n += samples_[i].tokens() - 1;
  return n;
}

at::Tensor ResponseTraining::lossSum(DecoderModel& model, const std::vector<int64_t>& samples) {
  std::vector<const rollout::ResponseSample*> chosen;
  for (int64_t i : samples) chosen.push_back(&samples_[i]);
  const ResponseBatch batch = packResponses(chosen);
  const at::Device device = model.device();
  const at::Tensor inputs = batch.inputs.to(device), labels = batch.labels.to(device).reshape({-1});
  const at::Tensor logits = model.logits(inputs);
  const at::Tensor rows = logits.view({-1, logits.size(-1)});
  const LossSpec& loss = spec_.train.loss;
  switch (loss.kind) {
    case LossSpec::Kind::kCrossEntropy:
      return model.tokenLogprobs(rows, labels).sum().neg();
    case LossSpec::Kind::kPolicyGradient: {
      PolicyGradientTerms terms =
          policyGradientLoss(model.tokenLogprobs(rows, labels), batch.oldLogprobs.to(device).reshape({-1}),
                             batch.advantages.to(device).reshape({-1}), labels, loss.clipRatioLow, loss.clipRatioHigh);
      clippedTokens_ = clippedTokens_.defined() ? clippedTokens_ + terms.clippedTokens : terms.clippedTokens;
      ratioSum_ = ratioSum_.defined() ? ratioSum_ + terms.ratioSum : terms.ratioSum;
      return terms.lossSum;
    }
    case LossSpec::Kind::kJsd: {
      at::Tensor teacherLogits;
      {
        at::NoGradGuard noGrad;
        teacherLogits = teacher_->logits(inputs);
      }
      return jsdLossSum(rows, teacherLogits.view({-1, teacherLogits.size(-1)}), labels,
                        {.beta = loss.beta, .temperature = loss.temperature, .pointwiseClip = loss.pointwiseClip},
                        loss.teacherTopK, model.vocabShard());
    }
  }
  return {};
}

StatusOr<std::map<std::string, double>> ResponseTraining::takeStepMetrics(backends::Communicator& dp,
                                                                          double stepTokens) {
  std::map<std::string, double> out;
  if (scored_) out["reward_mean"] = meanReward_;
  out["response_tokens"] = stepTokens;
  if (!clippedTokens_.defined()) return out;
  at::Tensor sums = at::stack({clippedTokens_, ratioSum_}).to(at::kDouble);
  clippedTokens_ = ratioSum_ = at::Tensor();
  if (dp.size() > 1) RETURN_IF_ERROR(dp.allReduce(sums, backends::ReduceOp::kSum)->wait().withContext("policy statistics all-reduce"));
  sums = sums.cpu();
  out["pg_clip_fraction"] = sums[0].item<double>() / std::max(1.0, stepTokens);
  out["importance_ratio_mean"] = sums[1].item<double>() / std::max(1.0, stepTokens);
  return out;
}

std::string ResponseTraining::describe() const {
  std::set<std::string> prompts;
  int64_t response = 0;
  for (const rollout::ResponseSample& s : samples_) {
    prompts.insert(s.id);
    response += static_cast<int64_t>(s.responseTokenIds.size());
  }
  const LossSpec& loss = spec_.train.loss;
  std::string lossText = planner::lossKindName(loss.kind);
  if (loss.kind == LossSpec::Kind::kPolicyGradient)
    lossText += fmt::format(" (advantage {}, clip ratio {} / {})", planner::advantageKindName(loss.advantage),
                            loss.clipRatioLow, loss.clipRatioHigh);
  if (loss.kind == LossSpec::Kind::kJsd)
    lossText += fmt::format(" (beta {}, temperature {}, teacher {})", loss.beta, loss.temperature, loss.teacher);
  return fmt::format("rollout data: {} samples of {} prompts, {} response tokens{}; loss {}", samples_.size(),
                     prompts.size(), response, scored_ ? fmt::format(", mean reward {:.4f}", meanReward_) : "",
                     lossText);
}

}  // namespace loom::worker
