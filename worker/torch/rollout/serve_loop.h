#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "worker/data/hf_tokenizer.h"
#include "worker/rollout/latency_stats.h"
#include "worker/rollout/rollout_inbox.h"
#include "worker/rollout/sample_text.h"
#include "worker/torch/rollout/rollout_engine.h"

namespace loom::worker {

// Loads the weights of a directory into the model, refusing (and keeping the old ones) what does
// not fit it; returns the directory the tensors came from.
using WeightsLoader = std::function<StatusOr<std::string>(const std::string& dir)>;
using MetricsFn = std::function<void(int64_t step, const std::map<std::string, double>& metrics)>;

struct ServeOptions {
  const data::HfTokenizer* tokenizer = nullptr;  // null: token ids only
  uint64_t seed = 0;                             // rollout.seed: requests without their own seed
  std::string weightsSource;                     // where the first weights came from
  WeightsLoader loadWeights;
  MetricsFn metrics;  // every 10 s: the metrics a batch rollout reports, rates since the last report
};

// A served rollout's engine loop: between steps it takes what the rollout service posted (new
// requests, cancellations, pauses, weight updates), then computes a step and feeds each
// request's sink. It runs until the process is stopped (the job cancelled).
//
// A weight update stops admission (new requests are held), waits for the requests in flight to
// finish or aborts them, swaps the weights and admits what it held: a request's tokens all come
// from one version of the weights, which every response names.
class ServeLoop {
 public:
  ServeLoop(RolloutEngine& engine, rollout::RolloutInbox& inbox, ServeOptions options);
  [[noreturn]] void run();

  // One pass: commands, then a step unless paused or idle. Waits up to `idleWait` for a command
  // when there is nothing to compute.
  void runOnce(std::chrono::milliseconds idleWait);

 private:
  using Clock = std::chrono::steady_clock;
  using Handle = rollout::RolloutInbox::Handle;
  struct Served {
    Handle handle = 0;
    std::shared_ptr<rollout::RequestSink> sink;
    int live = 0;  // samples not finished
    std::vector<std::optional<rollout::SampleText>> texts;  // per sample, with a tokenizer
    std::vector<size_t> textSent;                           // bytes of each sample's text sent
    Clock::time_point arrival;
    std::vector<Clock::time_point> lastToken;  // per sample; arrival until its first token
    std::vector<bool> drewAny;
  };

  void admit(rollout::RolloutInbox::Submission submission);
  void cancel(Handle handle, rollout::FinishReason reason);
  void applyPause(const rollout::PauseOrder& order);
  // The update at the front of the queue, once nothing is in flight (or at once with abort).
  void advanceUpdates();
  // Whether the engine has a step to compute or collect now.
  bool computing() const;
  // One engine step (RolloutEngine::step), its tokens and ends sent to their streams.
  void step(bool launchMore);
  void onToken(const TokenEvent& e, Clock::time_point now, std::vector<rollout::SequenceId>& stopped);
  void onFinished(const rollout::FinishedSequence& f);
  rollout::RolloutStatusView statusView() const;
  void report(Clock::time_point now);

  RolloutEngine& engine_;
  rollout::RolloutInbox& inbox_;
  ServeOptions options_;
  std::unordered_map<rollout::RequestId, Served> served_;
  std::unordered_map<Handle, rollout::RequestId> requestOf_;
  std::deque<rollout::RolloutInbox::Submission> held_;  // while a weight update waits
  std::deque<rollout::WeightsOrder> updates_;
  bool paused_ = false;
  int64_t version_ = 0;
  std::string source_;
  uint64_t admitted_ = 0;
  int64_t requestsServed_ = 0;
  int64_t steps_ = 0, outputTokens_ = 0, promptTokens_ = 0;
  int64_t reportedOutput_ = 0, reportedPrompt_ = 0;  // at the last report: its rates are since then
  rollout::LatencyStats latency_{65536};
  Clock::time_point lastReport_ = Clock::now();
};

}  // namespace loom::worker
