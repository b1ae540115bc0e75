#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "worker/data/hf_tokenizer.h"
#include "worker/rollout/latency_stats.h"
#include "worker/rollout/prompts_file.h"
#include "worker/rollout/results_file.h"
#include "worker/rollout/sample_text.h"
#include "worker/torch/rollout/rollout_engine.h"

namespace loom::worker {

// A batch rollout's results: each sample's tokens, logprobs, text and times as the steps
// produce them (the results file's lines), and the latency samples of the whole run.
class ResultCollector {
 public:
  using Clock = std::chrono::steady_clock;

  ResultCollector(const std::vector<rollout::PromptLine>& prompts, const data::HfTokenizer* tokenizer)
      : prompts_(prompts), tokenizer_(tokenizer) {}

  void addRequest(rollout::RequestId id, size_t line, std::vector<int64_t> promptTokenIds, Clock::time_point arrival) {
    lineOf_[id] = line;
    promptTokens_[id] = std::move(promptTokenIds);
    arrival_[id] = arrival;
  }
  // Records a drawn token; true when a stop string of the request now ends the sample's text.
  bool onToken(const TokenEvent& e, Clock::time_point now);
  void onFinished(const rollout::FinishedSequence& f);
  std::vector<rollout::SampleResult> takeResults();
  size_t numSamples() const { return samples_.size(); }
  int64_t outputTokens() const { return outputTokens_; }
  double ttft(double q) const { return latency_.ttft(q); }
  double itl(double q) const { return latency_.itl(q); }

 private:
  struct Sample {
    rollout::SampleResult result;
    std::optional<rollout::SampleText> text;
    Clock::time_point arrival, lastToken;
  };
  const std::vector<rollout::PromptLine>& prompts_;
  const data::HfTokenizer* tokenizer_;
  std::map<rollout::RequestId, size_t> lineOf_;
  std::map<rollout::RequestId, std::vector<int64_t>> promptTokens_;
  std::map<rollout::RequestId, Clock::time_point> arrival_;
  std::map<std::pair<rollout::RequestId, int>, Sample> samples_;
  rollout::LatencyStats latency_;
  int64_t outputTokens_ = 0;
};

}  // namespace loom::worker
