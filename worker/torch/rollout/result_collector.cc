#include "worker/torch/rollout/result_collector.h"

namespace loom::worker {

namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

bool ResultCollector::onToken(const TokenEvent& e, Clock::time_point now) {
  Sample& s = samples_[{e.request, e.sample}];
  rollout::SampleResult& out = s.result;
  if (out.tokenIds.empty()) {
    const rollout::PromptLine& p = prompts_[lineOf_.at(e.request)];
    out.id = p.id;
    out.order = p.line;
    out.sample = e.sample;
    out.promptTokenIds = promptTokens_.at(e.request);
    out.reference = p.reference;
    if (tokenizer_) s.text.emplace(*tokenizer_, p.sampling.stop);
    s.arrival = arrival_.at(e.request);
    out.timeToFirstTokenS = seconds(now - s.arrival);
    latency_.firstToken(out.timeToFirstTokenS);
  } else {
    latency_.interToken(seconds(now - s.lastToken));
  }
  s.lastToken = now;
  out.tokenIds.push_back(e.drawn.token);
  out.logprobs.push_back(e.drawn.logprob);
  if (!e.drawn.top.empty()) out.topLogprobs.push_back(e.drawn.top);
  ++outputTokens_;
  return s.text && s.text->append(e.drawn.token);
}

void ResultCollector::onFinished(const rollout::FinishedSequence& f) {
  Sample& s = samples_[{f.request, f.sample}];
  s.result.finishReason = rollout::finishReasonName(f.reason);
  s.result.timeS = seconds(s.lastToken - s.arrival);
  if (s.text) s.result.text = s.text->finish();
}

std::vector<rollout::SampleResult> ResultCollector::takeResults() {
  std::vector<rollout::SampleResult> all;
  for (auto& [key, s] : samples_) all.push_back(std::move(s.result));
  return all;
}

}  // namespace loom::worker
