#include "worker/torch/rollout/serve_loop.h"

#include <algorithm>

#include <fmt/format.h>

#include "worker/rollout/prompts_file.h"

namespace loom::worker {

namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

ServeLoop::ServeLoop(RolloutEngine& engine, rollout::RolloutInbox& inbox, ServeOptions options)
    : engine_(engine), inbox_(inbox), options_(std::move(options)), source_(options_.weightsSource) {
  inbox_.publish(statusView());
}

void ServeLoop::run() {
  for (;;) runOnce(std::chrono::milliseconds(200));
}

void ServeLoop::runOnce(std::chrono::milliseconds idleWait) {
  rollout::RolloutInbox::Commands commands = inbox_.take(computing() ? std::chrono::milliseconds(0) : idleWait);
  for (const rollout::PauseOrder& order : commands.pauses) applyPause(order);
  for (Handle handle : commands.cancelled) cancel(handle, rollout::FinishReason::kCancelled);
  for (rollout::WeightsOrder& order : commands.updates) updates_.push_back(std::move(order));
  for (rollout::RolloutInbox::Submission& s : commands.submitted) {
    if (updates_.empty()) {
      admit(std::move(s));
    } else {
      held_.push_back(std::move(s));
    }
  }
  advanceUpdates();
  if (computing()) step(/*launchMore=*/!paused_);
  const Clock::time_point now = Clock::now();
  inbox_.publish(statusView());
  // Every report is stored by the planner, and a served job runs for days: one in 10 s.
  if (seconds(now - lastReport_) >= 10.0) report(now);
}

bool ServeLoop::computing() const {
  // Paused, a step already launched still comes back, and nothing more is launched.
  return (!paused_ && !engine_.idle()) || engine_.stepInFlight();
}

void ServeLoop::admit(rollout::RolloutInbox::Submission submission) {
  rollout::ServedPrompt& p = submission.prompt;
  auto ids = rollout::promptTokenIds(p.isText, p.text, std::move(p.tokenIds), p.sampling, options_.tokenizer);
  if (!ids.isOk()) return submission.sink->failed(ids.status());
  const std::vector<int64_t> promptTokenIds = *ids;
  auto id = engine_.addRequest(std::move(*ids), p.sampling, options_.seed + admitted_++);
  if (!id.isOk()) return submission.sink->failed(id.status());
  const size_t n = static_cast<size_t>(p.sampling.n);
  Served s{.handle = submission.handle, .sink = std::move(submission.sink), .live = static_cast<int>(n),
           .texts = std::vector<std::optional<rollout::SampleText>>(n), .textSent = std::vector<size_t>(n, 0),
           .arrival = Clock::now(), .lastToken = {}, .drewAny = std::vector<bool>(n, false)};
  s.lastToken.assign(n, s.arrival);
  if (options_.tokenizer)
    for (auto& text : s.texts) text.emplace(*options_.tokenizer, p.sampling.stop);
  s.sink->accepted(promptTokenIds, version_);
  requestOf_[s.handle] = *id;
  served_.emplace(*id, std::move(s));
}

void ServeLoop::cancel(Handle handle, rollout::FinishReason reason) {
  auto held = std::find_if(held_.begin(), held_.end(), [&](const auto& s) { return s.handle == handle; });
  if (held != held_.end()) {
    held->sink->failed(Status(StatusCode::kCancelled, "cancelled before it was admitted"));
    held_.erase(held);
    return;
  }
  auto it = requestOf_.find(handle);
  if (it == requestOf_.end()) return;  // finished meanwhile
  for (const rollout::FinishedSequence& f : engine_.cancel(it->second, reason)) onFinished(f);
}

void ServeLoop::applyPause(const rollout::PauseOrder& order) {
  paused_ = order.pause;
  order.reply(statusView());
}

void ServeLoop::advanceUpdates() {
  while (!updates_.empty()) {
    rollout::WeightsOrder& order = updates_.front();
    if (order.abortInFlight) {
      std::vector<Handle> inFlight;
      for (const auto& [id, s] : served_) inFlight.push_back(s.handle);
      for (Handle h : inFlight) cancel(h, rollout::FinishReason::kAborted);
    } else if (!served_.empty()) {
      if (!paused_) return;  // the requests in flight finish on the weights they started with
      rollout::WeightsOrder refused = std::move(order);
      updates_.pop_front();
      refused.reply(failedPrecondition("the rollout is paused with {} request(s) in flight, which would never "
                                       "finish: resume it, or update with in_flight abort",
                                       served_.size()));
      continue;
    }
    rollout::WeightsOrder done = std::move(order);
    updates_.pop_front();
    if (engine_.stepInFlight()) step(/*launchMore=*/false);  // the weights change under no step
    const Clock::time_point start = Clock::now();
    auto loaded = options_.loadWeights(done.dir);
    if (!loaded.isOk()) {
      done.reply(loaded.status());
      continue;
    }
    version_ = done.version > 0 ? done.version : version_ + 1;
    source_ = *loaded;
    std::printf("rollout: weights version %lld from %s in %.2f s\n", static_cast<long long>(version_),
                source_.c_str(), seconds(Clock::now() - start));
    std::fflush(stdout);
    done.reply(statusView());
  }
  while (!held_.empty()) {
    admit(std::move(held_.front()));
    held_.pop_front();
  }
}

void ServeLoop::step(bool launchMore) {
  StepEvents events = engine_.step(launchMore);
  const Clock::time_point now = Clock::now();
  ++steps_;
  promptTokens_ += events.promptTokens;
  std::vector<rollout::SequenceId> stopped;
  for (const TokenEvent& e : events.tokens) onToken(e, now, stopped);
  for (const rollout::FinishedSequence& f : events.finished) onFinished(f);
  // A stop string ends a sample its stop rule has not ended already this step.
  for (rollout::SequenceId id : stopped)
    if (engine_.scheduler().sequence(id)) onFinished(engine_.finish(id, rollout::FinishReason::kStop));
}

void ServeLoop::onToken(const TokenEvent& e, Clock::time_point now, std::vector<rollout::SequenceId>& stopped) {
  Served& s = served_.at(e.request);
  const size_t i = static_cast<size_t>(e.sample);
  if (s.drewAny[i]) {
    latency_.interToken(seconds(now - s.lastToken[i]));
  } else {
    latency_.firstToken(seconds(now - s.arrival));
    s.drewAny[i] = true;
  }
  s.lastToken[i] = now;
  ++outputTokens_;
  std::string_view text;
  if (s.texts[i]) {
    if (s.texts[i]->append(e.drawn.token)) stopped.push_back(e.sequence);
    const size_t settled = s.texts[i]->settledSize();
    text = std::string_view(s.texts[i]->text()).substr(s.textSent[i], settled - s.textSent[i]);
    s.textSent[i] = settled;
  }
  s.sink->token(e.sample, e.drawn, text);
}

void ServeLoop::onFinished(const rollout::FinishedSequence& f) {
  auto it = served_.find(f.request);
  if (it == served_.end()) return;
  Served& s = it->second;
  const size_t i = static_cast<size_t>(f.sample);
  std::string rest;
  if (s.texts[i]) rest = s.texts[i]->finish().substr(s.textSent[i]);
  s.sink->finished(f.sample, f.reason, rest);
  if (--s.live > 0) return;
  s.sink->done();
  ++requestsServed_;
  requestOf_.erase(s.handle);
  served_.erase(it);
}

rollout::RolloutStatusView ServeLoop::statusView() const {
  const rollout::Scheduler& scheduler = engine_.scheduler();
  return {.weightsVersion = version_,
          .weightsSource = source_,
          .paused = paused_,
          .requestsRunning = scheduler.numRunning(),
          .requestsWaiting = scheduler.numWaiting() + static_cast<int64_t>(held_.size()),
          .kvBlocksUsed = scheduler.numBlocksUsed(),
          .kvBlocksTotal = scheduler.limits().numBlocks,
          .preemptions = scheduler.numPreemptions(),
          .requestsServed = requestsServed_,
          .outputTokens = outputTokens_,
          .updatesPending = static_cast<int64_t>(updates_.size())};
}

void ServeLoop::report(Clock::time_point now) {
  const double elapsed = std::max(1e-9, seconds(now - lastReport_));
  const rollout::Scheduler& s = engine_.scheduler();
  options_.metrics(steps_, {{"rollout_requests_running", double(s.numRunning())},
                            {"rollout_requests_waiting", double(s.numWaiting() + static_cast<int64_t>(held_.size()))},
                            {"rollout_kv_blocks_used", double(s.numBlocksUsed())},
                            {"rollout_preemptions", double(s.numPreemptions())},
                            {"rollout_prompt_tokens_per_s", double(promptTokens_ - reportedPrompt_) / elapsed},
                            {"rollout_output_tokens_per_s", double(outputTokens_ - reportedOutput_) / elapsed},
                            {"rollout_ttft_p50_s", latency_.ttft(0.5)},
                            {"rollout_itl_p50_s", latency_.itl(0.5)},
                            {"rollout_weights_version", double(version_)}});
  reportedPrompt_ = promptTokens_;
  reportedOutput_ = outputTokens_;
  lastReport_ = now;
}

}  // namespace loom::worker
