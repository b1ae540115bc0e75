#include "worker/torch/rollout/rollout_engine.h"

#include <ATen/ATen.h>

#include "worker/torch/rollout/step_batch.h"

namespace loom::worker {

RolloutEngine::RolloutEngine(DecoderModel& model, PagedKvCache cache, EngineOptions options)
    : model_(model), cache_(std::move(cache)), options_(std::move(options)), scheduler_(options_.limits) {
  if (options_.cudaGraphs) {
    const rollout::SchedulerLimits& l = options_.limits;
    graphs_ = makeDecodeGraphs(model_, cache_, l.maxNumSeqs, (l.maxModelLen + l.blockSize - 1) / l.blockSize,
                               /*scratchBlock=*/l.numBlocks);
  }
}

std::optional<int64_t> RolloutEngine::warmUp() {
  if (options_.group || !model_.device().is_cuda()) return std::nullopt;
  return warmUpRollout(model_, cache_, options_.limits, /*scratchBlock=*/options_.limits.numBlocks, graphs_.get());
}

StatusOr<rollout::RequestId> RolloutEngine::addRequest(std::vector<int64_t> prompt,
                                                       const planner::SamplingParams& params, uint64_t seed) {
  const int64_t vocab = model_.config().vocabSize;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      return invalidArgument("prompt_token_ids[{}]: {} is outside the model's vocabulary of {}", i, prompt[i], vocab);
  for (int64_t id : params.stopTokenIds)
    if (id >= vocab) return invalidArgument("stop_token_ids: {} is outside the model's vocabulary of {}", id, vocab);
  rollout::RequestOptions request{.prompt = std::move(prompt),
                                  .n = static_cast<int>(params.n),
                                  .stop = {.maxNewTokens = params.maxNewTokens,
                                           .eosTokenIds = options_.eosTokenIds,
                                           .stopTokenIds = params.stopTokenIds,
                                           .ignoreEos = params.ignoreEos}};
  ASSIGN_OR_RETURN(rollout::RequestId id, scheduler_.addRequest(std::move(request)));
  RequestState state{.params = params, .generators = {}, .live = static_cast<int>(params.n)};
  const uint64_t base = params.seed ? static_cast<uint64_t>(*params.seed) : seed;
  for (int64_t j = 0; j < params.n; ++j) state.generators.push_back(sampleGenerator(base, j));
  requests_.emplace(id, std::move(state));
  return id;
}

StepEvents RolloutEngine::step(bool launchMore) {
  if (!inFlight_) {
    if (!launchMore) return {};
    rollout::ScheduledStep first = scheduler_.schedule();
    if (first.empty()) return {};
    inFlight_ = launch(std::move(first));
  }
  // The next step goes to the device before this one's tokens come back, where it can.
  std::unique_ptr<InFlight> next;
  if (launchMore && asyncScheduling() && scheduler_.canScheduleAhead()) {
    rollout::ScheduledStep ahead = scheduler_.schedule();
    if (!ahead.empty()) next = launch(std::move(ahead));
  }
  StepEvents events = collect(*inFlight_);
  inFlight_ = std::move(next);
  return events;
}

std::unique_ptr<RolloutEngine::InFlight> RolloutEngine::launch(rollout::ScheduledStep step) {
  auto launched = std::make_unique<InFlight>();
  std::vector<int64_t> logitRow;
  const HostStep host = encodeStep(step, scheduler_, model_.device().is_cuda(), &logitRow,
                                   inFlight_ ? &inFlight_->rowOf : nullptr);
  if (options_.group) options_.group->sendStep(host);
  StepBatch batch = placeStep(host, model_.device(), cache_.blockSize, model_.config().slidingWindow);
  if (inFlight_) fillPendingTokens(batch, inFlight_->draws.tokens);
  cache_.copyBlocks(batch.copyFrom, batch.copyTo);
  at::Tensor logits = graphs_ && graphs_->covers(batch) ? graphs_->run(batch)
                                                         : model_.pagedLogits(batch.tokens, batch.paged, cache_);
  if (options_.group) logits = options_.group->gatherLogits(logits, model_.config().vocabSize);

  // Each drawing chunk draws for its sequence's sample and, when the prompt forks, the rest.
  std::vector<Draw> draws;
  launched->firstDraw.resize(step.chunks.size());
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    const rollout::ScheduledChunk& c = step.chunks[i];
    const rollout::Sequence& s = *scheduler_.sequence(c.sequence);
    RequestState& request = requests_.at(s.request);
    launched->firstDraw[i] = draws.size();
    if (c.samples > 0) launched->rowOf[c.sequence] = static_cast<int64_t>(draws.size());
    for (int j = 0; j < c.samples; ++j)
      draws.push_back({.row = logitRow[i], .params = &request.params,
                       .generator = &request.generators[s.sample + j]});
  }
  launched->draws = launchDraws(logits, draws);
  launched->step = std::move(step);
  return launched;
}

StepEvents RolloutEngine::collect(InFlight& done) {
  const rollout::ScheduledStep& step = done.step;
  StepEvents events;
  events.computedTokens = step.numTokens;
  for (const rollout::ScheduledChunk& c : step.chunks)
    if (c.count > 1) events.promptTokens += c.count;
  const std::vector<DrawnToken> drawn = collectDraws(done.draws);
  std::vector<std::vector<int64_t>> sampled(step.chunks.size());
  for (size_t i = 0; i < step.chunks.size(); ++i)
    for (int j = 0; j < step.chunks[i].samples; ++j) sampled[i].push_back(drawn[done.firstDraw[i] + j].token);

  rollout::StepResult result = scheduler_.complete(step, sampled);
  for (const auto& a : result.appended)
    events.tokens.push_back({.request = a.request, .sample = a.sample, .sequence = a.sequence,
                             .drawn = drawn[done.firstDraw[a.chunk] + a.draw]});
  events.finished = std::move(result.finished);
  forget(events.finished);
  return events;
}

void RolloutEngine::forget(const std::vector<rollout::FinishedSequence>& finished) {
  for (const auto& f : finished) {
    auto it = requests_.find(f.request);
    if (it != requests_.end() && --it->second.live == 0) requests_.erase(it);
  }
}

rollout::FinishedSequence RolloutEngine::finish(rollout::SequenceId sequence, rollout::FinishReason reason) {
  rollout::FinishedSequence f = scheduler_.finish(sequence, reason);
  forget({f});
  return f;
}

std::vector<rollout::FinishedSequence> RolloutEngine::cancel(rollout::RequestId request,
                                                             rollout::FinishReason reason) {
  std::vector<rollout::FinishedSequence> finished = scheduler_.cancelRequest(request, reason);
  requests_.erase(request);
  return finished;
}

}  // namespace loom::worker
