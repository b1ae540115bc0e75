#include "worker/rollout/scheduler.h"

#include <map>
#include <numeric>
#include <optional>
#include <random>

#include "tests/catch.h"

using namespace loom;
using namespace loom::rollout;

namespace {

SchedulerLimits limits(int32_t blocks, int64_t maxSeqs = 8, int64_t maxTokens = 64, int32_t blockSize = 4) {
  return {.blockSize = blockSize, .numBlocks = blocks, .maxNumSeqs = maxSeqs, .maxNumBatchedTokens = maxTokens,
          .maxModelLen = 1024, .watermark = 0};
}

std::vector<int64_t> prompt(int64_t length, int64_t first = 1) {
  std::vector<int64_t> p(length);
  std::iota(p.begin(), p.end(), first);
  return p;
}

// A stand-in for the model and sampler: the next token is a function of the whole sequence so
// far (and the sample), so any mistake in what the scheduler hands back shows in the output.
int64_t nextToken(const Sequence& s, int64_t computedAfter, int sample) {
  int64_t h = sample * 7919;
  for (int64_t i = 0; i < computedAfter; ++i) h = (h * 31 + s.tokens[i]) % 1000;
  return h + 2;
}

std::vector<std::vector<int64_t>> draw(const Scheduler& scheduler, const ScheduledStep& step) {
  std::vector<std::vector<int64_t>> sampled;
  for (const ScheduledChunk& c : step.chunks) {
    std::vector<int64_t> tokens;
    if (!scheduler.sequence(c.sequence)) {  // ended while the step ran: complete() skips it
      sampled.push_back(tokens);
      continue;
    }
    const Sequence& s = *scheduler.sequence(c.sequence);
    for (int j = 0; j < c.samples; ++j) tokens.push_back(nextToken(s, c.start + c.count, s.sample + j));
    sampled.push_back(tokens);
  }
  return sampled;
}

// Runs the scheduler to the end; outputs by (request, sample).
std::map<std::pair<RequestId, int>, FinishedSequence> runAll(Scheduler& scheduler, int64_t* steps = nullptr) {
  std::map<std::pair<RequestId, int>, FinishedSequence> done;
  int64_t n = 0;
  while (!scheduler.idle()) {
    ScheduledStep step = scheduler.schedule();
    REQUIRE(!step.empty());
    REQUIRE(step.numTokens <= scheduler.limits().maxNumBatchedTokens);
    for (auto& f : scheduler.complete(step, draw(scheduler, step)).finished)
      done.emplace(std::make_pair(f.request, f.sample), f);
    REQUIRE(++n < 100000);
  }
  if (steps) *steps = n;
  return done;
}

RequestOptions request(int64_t promptLength, int64_t maxNew, int n = 1, int64_t first = 1) {
  return {.prompt = prompt(promptLength, first), .n = n, .stop = {.maxNewTokens = maxNew}};
}

}  // namespace

TEST_CASE("block pool: allocates in order, shares and frees", "[rollout]") {
  BlockPool pool(3);
  CHECK(*pool.allocate() == 0);
  CHECK(*pool.allocate() == 1);
  pool.share(1);
  CHECK(pool.holders(1) == 2);
  pool.release(1);
  CHECK(pool.numFree() == 1);
  pool.release(1);
  CHECK(pool.numFree() == 2);
  CHECK(*pool.allocate() == 1);  // the block freed last comes back first
  CHECK(*pool.allocate() == 2);
  CHECK(!pool.allocate());
}

TEST_CASE("scheduler: a prompt in chunks within the token budget, then one token a step", "[rollout]") {
  Scheduler scheduler(limits(64, 8, 16));
  REQUIRE(scheduler.addRequest(request(40, 3)).isOk());
  std::vector<std::pair<int64_t, int64_t>> chunks;
  std::vector<int> samples;
  while (!scheduler.idle()) {
    ScheduledStep step = scheduler.schedule();
    REQUIRE(step.chunks.size() == 1);
    chunks.emplace_back(step.chunks[0].start, step.chunks[0].count);
    samples.push_back(step.chunks[0].samples);
    auto result = scheduler.complete(step, draw(scheduler, step));
    if (!result.finished.empty()) {
      CHECK(result.finished[0].reason == FinishReason::kLength);
      CHECK(result.finished[0].output.size() == 3);
    }
  }
  CHECK(chunks == std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {16, 16}, {32, 8}, {40, 1}, {41, 1}});
  CHECK(samples == std::vector<int>{0, 0, 1, 1, 1});
  CHECK(scheduler.numBlocksUsed() == 0);
}

TEST_CASE("scheduler: decodes first, then prompt chunks, then admission", "[rollout]") {
  Scheduler scheduler(limits(64, 8, 10));
  REQUIRE(scheduler.addRequest(request(3, 5)).isOk());
  REQUIRE(scheduler.addRequest(request(3, 5)).isOk());
  ScheduledStep first = scheduler.schedule();
  REQUIRE(first.chunks.size() == 2);
  scheduler.complete(first, draw(scheduler, first));
  REQUIRE(scheduler.addRequest(request(20, 5)).isOk());
  ScheduledStep second = scheduler.schedule();
  REQUIRE(second.chunks.size() == 3);
  CHECK(second.chunks[0].count == 1);
  CHECK(second.chunks[1].count == 1);
  CHECK(second.chunks[2].start == 0);
  CHECK(second.chunks[2].count == 8);  // what the budget of 10 leaves
  CHECK(second.chunks[2].samples == 0);
}

TEST_CASE("scheduler: max_num_seqs holds the rest back", "[rollout]") {
  Scheduler scheduler(limits(64, 2, 64));
  for (int i = 0; i < 3; ++i) REQUIRE(scheduler.addRequest(request(4, 2)).isOk());
  ScheduledStep step = scheduler.schedule();
  CHECK(step.chunks.size() == 2);
  CHECK(scheduler.numWaiting() == 1);
  // A request of n samples counts as n sequences: it waits until n fit, and more than
  // max_num_seqs never would.
  Scheduler samples(limits(64, 3, 64));
  REQUIRE(samples.addRequest(request(4, 2)).isOk());
  REQUIRE(samples.addRequest(request(4, 2, /*n=*/3)).isOk());
  CHECK(samples.schedule().chunks.size() == 1);
  CHECK(samples.numWaiting() == 1);
  CHECK(samples.addRequest(request(4, 2, /*n=*/4)).status().message() ==
        "n: 4 samples run side by side, and rollout.max_num_seqs is 3");
}

TEST_CASE("scheduler: the newest running sequence is preempted and recomputed from its tokens", "[rollout]") {
  // 4 blocks of 4 tokens; two sequences of 6-token prompts take 2 blocks each, and the first to
  // grow past 8 tokens takes the second's.
  Scheduler scheduler(limits(4, 8, 64));
  const RequestId a = *scheduler.addRequest(request(6, 6, 1, 1));
  const RequestId b = *scheduler.addRequest(request(6, 6, 1, 100));
  int64_t preemptedAt = -1;
  std::map<RequestId, FinishedSequence> done;
  for (int step = 0; !scheduler.idle(); ++step) {
    ScheduledStep s = scheduler.schedule();
    if (!s.preempted.empty() && preemptedAt < 0) {
      preemptedAt = step;
      REQUIRE(s.preempted.size() == 1);
      const Sequence* victim = scheduler.sequence(s.preempted[0]);
      CHECK(victim->request == b);
      CHECK(victim->computed == 0);
      CHECK(victim->blocks.empty());
    }
    for (auto& f : scheduler.complete(s, draw(scheduler, s)).finished) done.emplace(f.request, f);
  }
  CHECK(preemptedAt > 0);
  CHECK(scheduler.numPreemptions() >= 1);
  // Each request's tokens are those it gets alone.
  for (RequestId id : {a, b}) {
    Scheduler alone(limits(64));
    REQUIRE(alone.addRequest(request(6, 6, 1, id == a ? 1 : 100)).isOk());
    auto reference = runAll(alone);
    CHECK(done.at(id).output == reference.begin()->second.output);
  }
}

TEST_CASE("scheduler: n samples share the prompt's blocks, copied when one writes into a shared block", "[rollout]") {
  Scheduler scheduler(limits(64, 8, 64));
  REQUIRE(scheduler.addRequest(request(6, 4, /*n=*/3)).isOk());
  ScheduledStep prefill = scheduler.schedule();
  REQUIRE(prefill.chunks.size() == 1);
  CHECK(prefill.chunks[0].samples == 3);
  auto result = scheduler.complete(prefill, draw(scheduler, prefill));
  CHECK(result.appended.size() == 3);
  CHECK(scheduler.numRunning() == 3);
  CHECK(scheduler.numBlocksUsed() == 2);  // 6 tokens in blocks of 4, held three times
  // Position 6 lies in the shared second block: two of the three copy it, the last keeps it.
  ScheduledStep decode = scheduler.schedule();
  CHECK(decode.chunks.size() == 3);
  CHECK(decode.copies.size() == 2);
  for (const BlockCopy& c : decode.copies) CHECK(c.from == 1);
  CHECK(scheduler.numBlocksUsed() == 4);
  auto done = runAll(scheduler);
  REQUIRE(done.size() == 3);
  // Different samples, different tokens (the stand-in sampler mixes the sample in).
  CHECK(done.at({0, 0}).output != done.at({0, 1}).output);
  CHECK(scheduler.numBlocksUsed() == 0);
}

TEST_CASE("scheduler: a prompt that fills its blocks forks without copies", "[rollout]") {
  Scheduler scheduler(limits(64, 8, 64));
  REQUIRE(scheduler.addRequest(request(8, 3, /*n=*/2)).isOk());
  ScheduledStep prefill = scheduler.schedule();
  scheduler.complete(prefill, draw(scheduler, prefill));
  ScheduledStep decode = scheduler.schedule();
  CHECK(decode.copies.empty());
  CHECK(scheduler.numBlocksUsed() == 4);  // 2 shared, one new each
}

TEST_CASE("scheduler: end of sequence, stop tokens and ignore_eos", "[rollout]") {
  auto finishWith = [](StopRule stop) {
    Scheduler scheduler(limits(64));
    REQUIRE(scheduler.addRequest({.prompt = prompt(3), .n = 1, .stop = stop}).isOk());
    ScheduledStep step = scheduler.schedule();
    Sequence s = *scheduler.sequence(step.chunks[0].sequence);
    const int64_t first = nextToken(s, 3, 0);
    auto result = scheduler.complete(step, {{first}});
    return std::make_pair(first, result.finished);
  };
  Scheduler probe(limits(64));
  REQUIRE(probe.addRequest({.prompt = prompt(3), .n = 1, .stop = {}}).isOk());
  ScheduledStep step = probe.schedule();
  const int64_t token = nextToken(*probe.sequence(step.chunks[0].sequence), 3, 0);

  auto [t1, eos] = finishWith({.maxNewTokens = 10, .eosTokenIds = {token}});
  REQUIRE(eos.size() == 1);
  CHECK(eos[0].reason == FinishReason::kEos);
  CHECK(eos[0].output == std::vector<int64_t>{token});
  auto [t2, stop] = finishWith({.maxNewTokens = 10, .stopTokenIds = {token}});
  REQUIRE(stop.size() == 1);
  CHECK(stop[0].reason == FinishReason::kStop);
  auto [t3, ignored] = finishWith({.maxNewTokens = 10, .eosTokenIds = {token}, .ignoreEos = true});
  CHECK(ignored.empty());
}

TEST_CASE("scheduler: a sequence ends at max_model_len", "[rollout]") {
  SchedulerLimits l = limits(64);
  l.maxModelLen = 8;
  Scheduler scheduler(l);
  REQUIRE(scheduler.addRequest(request(5, 100)).isOk());
  auto done = runAll(scheduler);
  CHECK(done.begin()->second.reason == FinishReason::kLength);
  CHECK(done.begin()->second.output.size() == 3);
}

TEST_CASE("scheduler: cancelling frees a request's blocks, queued or running", "[rollout]") {
  Scheduler scheduler(limits(64, 1, 64));
  const RequestId running = *scheduler.addRequest(request(10, 10));
  const RequestId queued = *scheduler.addRequest(request(10, 10));
  ScheduledStep step = scheduler.schedule();
  scheduler.complete(step, draw(scheduler, step));
  CHECK(scheduler.numBlocksUsed() == 3);
  auto cancelled = scheduler.cancelRequest(running);
  REQUIRE(cancelled.size() == 1);
  CHECK(cancelled[0].reason == FinishReason::kCancelled);
  CHECK(cancelled[0].output.size() == 1);
  CHECK(scheduler.numBlocksUsed() == 0);
  CHECK(scheduler.cancelRequest(queued).size() == 1);
  CHECK(scheduler.idle());
}

TEST_CASE("scheduler: a request aborted before its samples fork reports every sample", "[rollout]") {
  Scheduler scheduler(limits(64, 8, 64));
  const RequestId id = *scheduler.addRequest(request(10, 10, /*n=*/3));
  auto aborted = scheduler.cancelRequest(id, FinishReason::kAborted);
  REQUIRE(aborted.size() == 3);
  for (int j = 0; j < 3; ++j) {
    CHECK(aborted[j].sample == j);
    CHECK(aborted[j].reason == FinishReason::kAborted);
    CHECK(aborted[j].output.empty());
  }
  CHECK(aborted[0].sequence >= 0);
  CHECK(aborted[1].sequence == -1);
  CHECK(std::string(finishReasonName(FinishReason::kAborted)) == "aborted");
  CHECK(scheduler.idle());
}

TEST_CASE("scheduler: many requests arriving over time get the tokens they get alone", "[rollout]") {
  // A small cache, so that preemption and recomputation happen, with chunked prompts and samples.
  std::mt19937 random(7);
  Scheduler scheduler(limits(16, 6, 24));
  std::map<RequestId, RequestOptions> requests;
  std::map<std::pair<RequestId, int>, FinishedSequence> done;
  for (int step = 0; step < 100000 && (requests.size() < 64 || !scheduler.idle()); ++step) {
    if (requests.size() < 64 && step % 2 == 0) {
      RequestOptions r = request(1 + random() % 30, 1 + random() % 20, 1 + random() % 3, random() % 500);
      const RequestId id = *scheduler.addRequest(r);
      requests.emplace(id, r);
    }
    ScheduledStep s = scheduler.schedule();
    for (auto& f : scheduler.complete(s, draw(scheduler, s)).finished)
      done.emplace(std::make_pair(f.request, f.sample), f);
  }
  CHECK(scheduler.numPreemptions() > 0);
  CHECK(scheduler.numBlocksUsed() == 0);
  for (const auto& [id, r] : requests) {
    Scheduler alone(limits(64));
    REQUIRE(alone.addRequest(r).isOk());
    auto reference = runAll(alone);
    for (int sample = 0; sample < r.n; ++sample)
      CHECK(done.at({id, sample}).output == reference.at({0, sample}).output);
  }
}

TEST_CASE("scheduler: requests it could never run are refused, naming why", "[rollout]") {
  SchedulerLimits l = limits(4);
  l.maxModelLen = 32;
  Scheduler scheduler(l);
  auto empty = scheduler.addRequest(request(0, 4));
  CHECK(empty.status().message().find("prompt: empty") != std::string::npos);
  auto tooLong = scheduler.addRequest(request(32, 4));
  CHECK(tooLong.status().message().find("max_model_len") != std::string::npos);
  auto tooBig = scheduler.addRequest(request(10, 10));  // 20 tokens: 5 blocks of 4, the cache holds 4
  CHECK(tooBig.status().code() == StatusCode::kResourceExhausted);
  CHECK(tooBig.status().message().find("needs 5 KV blocks") != std::string::npos);
  CHECK(scheduler.addRequest(request(4, 4, 0)).status().message().find("n: must be at least 1") != std::string::npos);
  CHECK(scheduler.idle());

  SchedulerLimits budget = limits(4, 16, 8);
  CHECK(budget.validate().message().find("max_num_batched_tokens") != std::string::npos);
  SchedulerLimits noBlocks = limits(0);
  CHECK(noBlocks.validate().message().find("no block") != std::string::npos);
}

namespace {

// Runs the scheduler to the end as the engine does with asynchronous scheduling: each step is
// scheduled while the one before it still runs (where canScheduleAhead allows), and its drawn
// tokens are computed once that one has completed, as the device reads them. `arrive(step)` may
// add requests before each step, and says whether more are to come.
template <typename Arrive>
std::map<std::pair<RequestId, int>, FinishedSequence> runAhead(Scheduler& scheduler, Arrive arrive,
                                                               int64_t* aheadSteps) {
  std::map<std::pair<RequestId, int>, FinishedSequence> done;
  std::optional<ScheduledStep> running;
  *aheadSteps = 0;
  for (int step = 0; step < 100000; ++step) {
    const bool more = arrive(step);
    if (!running) {
      ScheduledStep first = scheduler.schedule();
      if (first.empty()) {
        if (scheduler.idle() && !more) break;
        continue;
      }
      running = std::move(first);
    }
    std::optional<ScheduledStep> next;
    if (scheduler.canScheduleAhead()) {
      ScheduledStep ahead = scheduler.schedule();
      REQUIRE(ahead.preempted.empty());
      if (!ahead.empty()) next = std::move(ahead), ++*aheadSteps;
    }
    for (auto& f : scheduler.complete(*running, draw(scheduler, *running)).finished)
      done.emplace(std::make_pair(f.request, f.sample), f);
    running = std::move(next);
  }
  REQUIRE(scheduler.idle());
  return done;
}

}  // namespace

TEST_CASE("scheduler: steps scheduled ahead of the running one give each request its tokens alone", "[rollout]") {
  // Preemption (in the steps not scheduled ahead), chunked prompts, samples, and end tokens
  // that end sequences a step after the next one was scheduled.
  std::vector<int64_t> ends;
  for (int64_t t = 2; t < 1002; t += 40) ends.push_back(t);
  std::mt19937 random(11);
  Scheduler scheduler(limits(16, 6, 24));
  std::map<RequestId, RequestOptions> requests;
  auto arrive = [&](int step) {
    if (requests.size() < 64 && step % 2 == 0) {
      RequestOptions r = request(1 + random() % 30, 1 + random() % 20, 1 + random() % 3, random() % 500);
      r.stop.eosTokenIds = ends;
      requests.emplace(*scheduler.addRequest(r), r);
    }
    return requests.size() < 64;
  };
  int64_t aheadSteps = 0;
  auto done = runAhead(scheduler, arrive, &aheadSteps);
  CHECK(aheadSteps > 100);
  CHECK(scheduler.numPreemptions() > 0);
  CHECK(scheduler.numBlocksUsed() == 0);
  int64_t endedByToken = 0;
  for (const auto& [id, r] : requests) {
    Scheduler alone(limits(64));
    REQUIRE(alone.addRequest(r).isOk());
    auto reference = runAll(alone);
    for (int sample = 0; sample < r.n; ++sample) {
      const FinishedSequence& got = done.at({id, sample});
      CHECK(got.output == reference.at({0, sample}).output);
      CHECK(got.reason == reference.at({0, sample}).reason);
      endedByToken += got.reason == FinishReason::kEos;
    }
  }
  CHECK(endedByToken > 0);
}

TEST_CASE("scheduler: a step scheduled ahead skips what the running step ends by length", "[rollout]") {
  Scheduler scheduler(limits(64, 8, 64));
  REQUIRE(scheduler.addRequest(request(8, 2, /*n=*/2)).isOk());
  ScheduledStep prefill = scheduler.schedule();
  REQUIRE(scheduler.canScheduleAhead());
  // The prompt's sequence decodes its first token ahead; its second sample forks only when the
  // prefill completes, from the prompt's blocks and not the block taken ahead.
  ScheduledStep second = scheduler.schedule();
  REQUIRE(second.chunks.size() == 1);
  CHECK(second.chunks[0].start == 8);
  CHECK(second.chunks[0].samples == 1);
  CHECK(scheduler.sequence(second.chunks[0].sequence)->tokens.back() == kPendingToken);
  auto first = scheduler.complete(prefill, draw(scheduler, prefill));
  REQUIRE(first.appended.size() == 2);
  for (const auto& a : first.appended)  // 8 tokens in blocks of 4, and the block for token 8
    CHECK(scheduler.sequence(a.sequence)->blocks.size() == (a.sample == 0 ? 3u : 2u));
  // Both samples draw their last token in the next step: nothing is left to schedule after it.
  ScheduledStep third = scheduler.schedule();
  CHECK(third.chunks.size() == 1);  // the fork's first decode; the first sample is computing its last
  auto secondDone = scheduler.complete(second, draw(scheduler, second));
  REQUIRE(secondDone.finished.size() == 1);
  CHECK(secondDone.finished[0].output.size() == 2);
  CHECK(scheduler.schedule().empty());
  auto thirdDone = scheduler.complete(third, draw(scheduler, third));
  REQUIRE(thirdDone.finished.size() == 1);
  CHECK(thirdDone.finished[0].output.size() == 2);
  CHECK(scheduler.idle());
  CHECK(scheduler.numBlocksUsed() == 0);
}

TEST_CASE("scheduler: a sequence ended while a step computes it leaves no pending token", "[rollout]") {
  Scheduler scheduler(limits(64, 8, 64));
  REQUIRE(scheduler.addRequest(request(3, 10)).isOk());
  ScheduledStep prefill = scheduler.schedule();
  ScheduledStep decode = scheduler.schedule();
  auto result = scheduler.complete(prefill, draw(scheduler, prefill));
  REQUIRE(result.appended.size() == 1);
  // A stop string matched in the first token's text: the decode already launched is skipped.
  const FinishedSequence stopped = scheduler.finish(result.appended[0].sequence, FinishReason::kStop);
  CHECK(stopped.output == std::vector<int64_t>{result.appended[0].token});
  CHECK(scheduler.complete(decode, draw(scheduler, decode)).appended.empty());
  CHECK(scheduler.idle());
  CHECK(scheduler.numBlocksUsed() == 0);
}
