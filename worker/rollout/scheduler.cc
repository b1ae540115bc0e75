#include "worker/rollout/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace loom::rollout {

const char* finishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "?";
}

Status SchedulerLimits::validate() const {
  if (blockSize < 1) return invalidArgument("rollout.block_size: must be at least 1, got {}", blockSize);
  if (numBlocks < 1) return invalidArgument("rollout: the KV cache has no block of {} tokens", blockSize);
  if (maxNumSeqs < 1) return invalidArgument("rollout.max_num_seqs: must be at least 1, got {}", maxNumSeqs);
  if (maxModelLen < 2) return invalidArgument("rollout.max_model_len: must be at least 2, got {}", maxModelLen);
  // Every running sequence decodes each step: one token each must fit the budget.
  if (maxNumBatchedTokens < maxNumSeqs)
    return invalidArgument("rollout.max_num_batched_tokens: {} is below max_num_seqs {}: every running sequence "
                           "computes a token each step",
                           maxNumBatchedTokens, maxNumSeqs);
  if (watermark < 0 || watermark >= 1) return invalidArgument("rollout: block watermark {} is outside [0, 1)", watermark);
  return Status::ok();
}

Scheduler::Scheduler(const SchedulerLimits& limits) : limits_(limits), pool_(limits.numBlocks) {}

StatusOr<RequestId> Scheduler::addRequest(RequestOptions request) {
  const int64_t promptLength = static_cast<int64_t>(request.prompt.size());
  if (promptLength == 0) return invalidArgument("prompt: empty (a request needs at least one token)");
  if (promptLength >= limits_.maxModelLen)
    return invalidArgument("prompt: {} tokens leave no room for output in the model's context of {} tokens "
                           "(rollout.max_model_len)",
                           promptLength, limits_.maxModelLen);
  if (request.n < 1) return invalidArgument("n: must be at least 1, got {}", request.n);
  if (request.n > limits_.maxNumSeqs)
    return invalidArgument("n: {} samples run side by side, and rollout.max_num_seqs is {}", request.n,
                           limits_.maxNumSeqs);
  if (request.stop.maxNewTokens < 1)
    return invalidArgument("max_new_tokens: must be at least 1, got {}", request.stop.maxNewTokens);
  const int64_t longest = std::min(promptLength + request.stop.maxNewTokens, limits_.maxModelLen);
  if (blocksFor(longest) > limits_.numBlocks)
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("prompt: a sequence of {} tokens (prompt {} + max_new_tokens {}) needs {} KV blocks of "
                              "{} tokens, and the KV cache holds {} (rollout.kv_cache_memory_gb)",
                              longest, promptLength, longest - promptLength, blocksFor(longest), limits_.blockSize,
                              limits_.numBlocks));
  const RequestId id = nextRequest_++;
  Sequence s{.id = nextSequence_++,
             .request = id,
             .sample = 0,
             .tokens = std::move(request.prompt),
             .promptLength = promptLength,
             .computed = 0,
             .blocks = {},
             .pendingSamples = request.n - 1,
             .stop = std::move(request.stop)};
  waiting_.push_back(s.id);
  sequences_.emplace(s.id, std::move(s));
  return id;
}

const Sequence* Scheduler::sequence(SequenceId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : &it->second;
}

int64_t Scheduler::blocksNeeded(const Sequence& s, int64_t tokens) const {
  int64_t needed = std::max<int64_t>(0, blocksFor(tokens) - static_cast<int64_t>(s.blocks.size()));
  const bool writesIntoLast = s.computed % limits_.blockSize != 0;
  if (writesIntoLast && pool_.holders(s.blocks.back()) > 1) ++needed;
  return needed;
}

void Scheduler::allocateBlocks(Sequence& s, int64_t tokens, ScheduledStep& step) {
  if (s.computed % limits_.blockSize != 0 && pool_.holders(s.blocks.back()) > 1) {
    // The last block is shared with the prompt's other samples and this step writes into it.
    const int32_t copy = *pool_.allocate();
    step.copies.push_back({s.blocks.back(), copy});
    pool_.release(s.blocks.back());
    s.blocks.back() = copy;
  }
  while (static_cast<int64_t>(s.blocks.size()) < blocksFor(tokens)) s.blocks.push_back(*pool_.allocate());
}

void Scheduler::releaseBlocks(Sequence& s) {
  for (int32_t b : s.blocks) pool_.release(b);
  s.blocks.clear();
}

void Scheduler::preempt(SequenceId id, ScheduledStep& step) {
  Sequence& s = sequences_.at(id);
  auto chunk = std::find_if(step.chunks.begin(), step.chunks.end(),
                            [&](const ScheduledChunk& c) { return c.sequence == id; });
  if (chunk != step.chunks.end()) {
    if (chunk->samples > 0) {  // undo what scheduling it did
      s.tokens.pop_back();
      s.pendingSamples = chunk->samples - 1;
      s.forkingSamples -= chunk->samples - 1;
    }
    step.numTokens -= chunk->count;
    step.chunks.erase(chunk);
  }
  // Its blocks would go to others while an earlier step still writes into them.
  if (s.drawing()) std::abort();
  // A copy made for it this step would write into a block that is free again.
  for (int32_t b : s.blocks)
    step.copies.erase(std::remove_if(step.copies.begin(), step.copies.end(),
                                     [&](const BlockCopy& c) { return c.to == b && pool_.holders(b) == 1; }),
                      step.copies.end());
  releaseBlocks(s);
  s.computed = 0;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_front(id);
  step.preempted.push_back(id);
  ++preemptions_;
}

bool Scheduler::reserveBlocks(Sequence& s, int64_t tokens, ScheduledStep& step) {
  while (pool_.numFree() < blocksNeeded(s, tokens)) {
    const SequenceId newest = running_.back();
    preempt(newest, step);
    if (newest == s.id) return false;
  }
  allocateBlocks(s, tokens, step);
  return true;
}

int64_t Scheduler::runningSlots() const {
  int64_t slots = 0;
  for (SequenceId id : running_) {
    const Sequence& s = sequences_.at(id);
    slots += 1 + s.pendingSamples + s.forkingSamples;
  }
  return slots;
}

bool Scheduler::fullLength(const Sequence& s, int64_t held) const {
  return held - s.promptLength >= s.stop.maxNewTokens || held >= limits_.maxModelLen;
}

bool Scheduler::canScheduleAhead() const {
  int64_t needed = 0;
  for (SequenceId id : running_) {
    const Sequence& s = sequences_.at(id);
    const int64_t remaining = static_cast<int64_t>(s.tokens.size()) - s.computed;
    needed += blocksNeeded(s, s.computed + std::min(remaining, limits_.maxNumBatchedTokens));
  }
  return needed <= pool_.numFree();
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep step;
  auto budget = [&] { return limits_.maxNumBatchedTokens - step.numTokens; };
  auto add = [&](Sequence& s, int64_t count) {
    const bool last = s.computed + count == static_cast<int64_t>(s.tokens.size());
    step.chunks.push_back({.sequence = s.id, .start = s.computed, .count = count,
                           .samples = last ? 1 + s.pendingSamples : 0});
    step.numTokens += count;
    s.computed += count;
    if (!last) return;
    s.forkingSamples += s.pendingSamples;
    s.pendingSamples = 0;
    s.tokens.push_back(kPendingToken);
  };
  // Running sequences, decodes before prompt chunks. Preemption removes from running_, so walk
  // a copy and skip what is gone.
  for (const bool decodes : {true, false}) {
    const std::vector<SequenceId> running = running_;
    for (SequenceId id : running) {
      if (std::find(running_.begin(), running_.end(), id) == running_.end()) continue;
      Sequence& s = sequences_.at(id);
      const int64_t remaining = static_cast<int64_t>(s.tokens.size()) - s.computed;
      if ((remaining == 1) != decodes) continue;
      // The step running draws its last token.
      if (s.drawing() && fullLength(s, static_cast<int64_t>(s.tokens.size()))) continue;
      const int64_t count = std::min(remaining, budget());
      if (count == 0) break;
      if (!reserveBlocks(s, s.computed + count, step)) continue;
      add(s, count);
    }
  }
  // Admission in arrival order (preempted sequences first), never preempting for it.
  const auto watermark = static_cast<int64_t>(std::ceil(limits_.watermark * limits_.numBlocks));
  int64_t slots = runningSlots();
  while (!waiting_.empty() && budget() > 0) {
    Sequence& s = sequences_.at(waiting_.front());
    if (slots + 1 + s.pendingSamples > limits_.maxNumSeqs) break;
    const int64_t count = std::min(static_cast<int64_t>(s.tokens.size()), budget());
    // With nothing running, a sequence is admitted whatever the watermark: nobody else will free blocks.
    const int64_t reserve = running_.empty() ? 0 : watermark;
    if (pool_.numFree() - blocksNeeded(s, count) < reserve) break;
    allocateBlocks(s, count, step);
    waiting_.pop_front();
    running_.push_back(s.id);
    slots += 1 + s.pendingSamples;
    add(s, count);
  }
  return step;
}

bool Scheduler::stops(const Sequence& s, int64_t index, FinishReason* reason) const {
  const int64_t token = s.tokens[index];
  auto holds = [&](const std::vector<int64_t>& ids) { return std::find(ids.begin(), ids.end(), token) != ids.end(); };
  if (!s.stop.ignoreEos && holds(s.stop.eosTokenIds)) {
    *reason = FinishReason::kEos;
  } else if (holds(s.stop.stopTokenIds)) {
    *reason = FinishReason::kStop;
  } else if (fullLength(s, index + 1)) {
    *reason = FinishReason::kLength;
  } else {
    return false;
  }
  return true;
}

FinishedSequence Scheduler::retire(SequenceId id, FinishReason reason) {
  Sequence& s = sequences_.at(id);
  releaseBlocks(s);
  if (s.drawing()) s.tokens.pop_back();  // ended while a step draws for it
  if (auto r = std::find(running_.begin(), running_.end(), id); r != running_.end()) running_.erase(r);
  if (auto w = std::find(waiting_.begin(), waiting_.end(), id); w != waiting_.end()) waiting_.erase(w);
  FinishedSequence done{.sequence = id,
                        .request = s.request,
                        .sample = s.sample,
                        .reason = reason,
                        .output = std::vector<int64_t>(s.tokens.begin() + s.promptLength, s.tokens.end())};
  sequences_.erase(id);
  return done;
}

StepResult Scheduler::complete(const ScheduledStep& step, const std::vector<std::vector<int64_t>>& sampled) {
  if (sampled.size() != step.chunks.size()) std::abort();  // the runner answers every chunk of the step it ran
  StepResult result;
  std::vector<std::pair<SequenceId, FinishReason>> ended;
  for (size_t i = 0; i < step.chunks.size(); ++i) {
    const ScheduledChunk& chunk = step.chunks[i];
    auto found = sequences_.find(chunk.sequence);
    if (found == sequences_.end() || chunk.samples == 0) continue;  // ended while the step ran, or a prompt's part
    Sequence& s = found->second;
    const int64_t at = chunk.start + chunk.count;  // where the drawn token goes
    if (static_cast<int>(sampled[i].size()) != chunk.samples || s.tokens.at(at) != kPendingToken) std::abort();
    // The prompt's other samples start from its blocks, each with its own first token. The
    // step after this one may have given `s` a block past the prompt already: not theirs.
    for (int j = 1; j < chunk.samples; ++j) {
      Sequence fork{.id = nextSequence_++,
                    .request = s.request,
                    .sample = s.sample + j,
                    .tokens = std::vector<int64_t>(s.tokens.begin(), s.tokens.begin() + at),
                    .promptLength = s.promptLength,
                    .computed = at,
                    .blocks = std::vector<int32_t>(s.blocks.begin(), s.blocks.begin() + blocksFor(at)),
                    .pendingSamples = 0,
                    .forkingSamples = 0,
                    .stop = s.stop};
      for (int32_t b : fork.blocks) pool_.share(b);
      fork.tokens.push_back(sampled[i][j]);
      result.appended.push_back({fork.id, fork.request, fork.sample, sampled[i][j], i, j});
      FinishReason reason;
      if (stops(fork, at, &reason)) ended.emplace_back(fork.id, reason);
      running_.push_back(fork.id);
      sequences_.emplace(fork.id, std::move(fork));
    }
    s.forkingSamples -= chunk.samples - 1;
    s.tokens[at] = sampled[i][0];
    result.appended.push_back({s.id, s.request, s.sample, sampled[i][0], i, 0});
    FinishReason reason;
    if (stops(s, at, &reason)) {
      s.tokens.resize(at + 1);  // a token the step after this one draws for it is not its output
      ended.emplace_back(s.id, reason);
    }
  }
  for (const auto& [id, reason] : ended) result.finished.push_back(retire(id, reason));
  return result;
}

FinishedSequence Scheduler::finish(SequenceId sequence, FinishReason reason) { return retire(sequence, reason); }

std::vector<FinishedSequence> Scheduler::cancelRequest(RequestId request, FinishReason reason) {
  std::vector<SequenceId> ids;
  for (const auto& [id, s] : sequences_)
    if (s.request == request) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  std::vector<FinishedSequence> out;
  for (SequenceId id : ids) {
    const Sequence& s = sequences_.at(id);
    const int first = s.sample, pending = s.pendingSamples + s.forkingSamples;
    out.push_back(retire(id, reason));
    // Samples that would have forked from this prompt end with it, having drawn nothing.
    for (int j = 1; j <= pending; ++j)
      out.push_back({.sequence = -1, .request = request, .sample = first + j, .reason = reason, .output = {}});
  }
  return out;
}

}  // namespace loom::rollout
