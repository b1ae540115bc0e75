#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "worker/rollout/response_samples.h"
#include "worker/torch/jobs/job_runner.h"
#include "worker/torch/model/decoder_model.h"

namespace loom::worker {

// Training on a rollout's results (data.format rollout, planner/post_training_spec.h): the samples,
// scored by data.reward or data.rewards and given their advantages for a policy-gradient loss; the
// teacher of a jsd loss, the same config with its own weights, laid out as the model is; and each
// micro-batch's loss as a sum over its response tokens, which the trainer divides by the step's
// count of them over every data-parallel rank.
class ResponseTraining {
 public:
  // Reads and checks every sample before the first step; errors name the spec field and the line.
  static StatusOr<std::unique_ptr<ResponseTraining>> create(RankSetup& rank, const DecoderModel& model);

  int64_t numSamples() const { return static_cast<int64_t>(samples_.size()); }
  // The response tokens (labels that count) and the input tokens of these samples.
  int64_t responseTokens(const std::vector<int64_t>& samples) const;
  int64_t inputTokens(const std::vector<int64_t>& samples) const;
  // The model's forward over the samples and the loss summed over their response tokens,
  // differentiable; its statistics join the step's.
  at::Tensor lossSum(DecoderModel& model, const std::vector<int64_t>& samples);
  // The step's statistics over every rank of `dp` as metrics, the step having `stepTokens`
  // response tokens in all; then cleared.
  StatusOr<std::map<std::string, double>> takeStepMetrics(backends::Communicator& dp, double stepTokens);
  // One line for rank 0's log: the data, its scores and the loss.
  std::string describe() const;

 private:
  ResponseTraining(const planner::JobSpec& spec, std::vector<rollout::ResponseSample> samples)
      : spec_(spec), samples_(std::move(samples)) {}

  const planner::JobSpec& spec_;
  std::vector<rollout::ResponseSample> samples_;
  std::unique_ptr<DecoderModel> teacher_;
  double meanReward_ = 0;
  bool scored_ = false;
  // Summed over the step's micro-batches: clipped tokens and importance ratios (policy gradient).
  at::Tensor clippedTokens_, ratioSum_;
};

}  // namespace loom::worker
