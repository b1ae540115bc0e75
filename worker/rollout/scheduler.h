#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "worker/rollout/block_pool.h"

namespace loom::rollout {

// Continuous batching over a paged KV cache, as plain bookkeeping: which tokens of which
// sequences the next forward computes, where their keys and values go, and what becomes of a
// sequence once a token is drawn for it. No tensors: the model runner turns a ScheduledStep into
// a batch, the sampler draws the tokens, and complete() takes them back. One thread owns it (the
// rollout loop); nothing here is thread-safe.
//
// A step schedules, within max_num_batched_tokens: every running sequence that decodes (one
// token), then the running prompts still being computed (chunked prefill), then waiting sequences
// in arrival order while the pool has blocks and max_num_seqs allows. A running sequence that
// needs a block when none is free takes one from the newest running sequence, which is preempted:
// its blocks are freed and it goes back to the front of the queue, to be recomputed from its
// tokens (prompt and output so far) when it is admitted again.
//
// Steps may overlap by one (asynchronous scheduling, as vLLM's): while a step runs on the device,
// the next one is scheduled and launched, its decodes reading the tokens the running step draws
// on the device. A scheduled step therefore counts its tokens as computed at once, and a chunk
// that draws appends kPendingToken, which complete() replaces with the token drawn. A sequence
// that the running step ends by length is not scheduled again; one it ends otherwise (an end
// token, a stop, a cancel) has its extra chunk skipped by complete(). Scheduling ahead never
// preempts: canScheduleAhead() says whether every running sequence's next chunk fits the free
// blocks, and when it does not, the runner completes the running step first.

using RequestId = int64_t;
using SequenceId = int64_t;

// kCancelled: by its client; kAborted: by a weight update that would not wait for it.
enum class FinishReason { kLength, kStop, kEos, kCancelled, kAborted };
const char* finishReasonName(FinishReason reason);  // "length", "stop", "eos", "cancelled", "aborted"

// A token drawn by a step still running: the next step's decode reads it on the device.
inline constexpr int64_t kPendingToken = -1;

struct SchedulerLimits {
  int32_t blockSize = 16;        // tokens per KV block
  int32_t numBlocks = 0;         // blocks in the KV cache
  int64_t maxNumSeqs = 256;      // sequences running at once
  int64_t maxNumBatchedTokens = 8192;  // tokens computed per step
  int64_t maxModelLen = 0;       // tokens a sequence may hold, prompt and output
  // Blocks admission leaves free, so that running sequences can grow a while before anything
  // is preempted (vLLM keeps 1% too).
  double watermark = 0.01;

  Status validate() const;
};

// When a sequence ends by itself.
struct StopRule {
  int64_t maxNewTokens = 16;
  std::vector<int64_t> eosTokenIds;  // the model's end of sequence; ignored with ignoreEos
  std::vector<int64_t> stopTokenIds;
  bool ignoreEos = false;
};

struct RequestOptions {
  std::vector<int64_t> prompt;
  int n = 1;  // samples drawn for the prompt, which share its KV blocks
  StopRule stop;
};

struct Sequence {
  SequenceId id = 0;
  RequestId request = 0;
  int sample = 0;  // which of the request's n samples
  std::vector<int64_t> tokens;  // the prompt, then the output; the last may be kPendingToken
  int64_t promptLength = 0;
  int64_t computed = 0;  // tokens whose keys and values are in the cache, or are being computed
  std::vector<int32_t> blocks;  // the block table: token t sits in blocks[t / blockSize]
  // Samples still to fork from this one when its prompt is computed (n - 1 until the prompt's
  // last chunk is scheduled), then those forking when that step completes.
  int pendingSamples = 0;
  int forkingSamples = 0;
  StopRule stop;

  int64_t numOutput() const { return static_cast<int64_t>(tokens.size()) - promptLength; }
  bool drawing() const { return !tokens.empty() && tokens.back() == kPendingToken; }
};

struct ScheduledChunk {
  SequenceId sequence = 0;
  int64_t start = 0, count = 0;  // the sequence's tokens [start, start + count), computed this step
  // Tokens drawn from the chunk's last row: 0 while a prompt is only partly computed; 1 (this
  // sequence's next token); or 1 + the samples that fork from it, the request's samples 0..n-1.
  int samples = 0;
};

// Block `from` copied to `to` before the step's forward: a shared block that one holder is about
// to write into (copy on write).
struct BlockCopy {
  int32_t from = 0, to = 0;
};

struct ScheduledStep {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prompt chunks
  std::vector<BlockCopy> copies;
  std::vector<SequenceId> preempted;   // sent back to wait this step, their blocks freed
  int64_t numTokens = 0;
  bool empty() const { return chunks.empty(); }
};

struct FinishedSequence {
  SequenceId sequence = 0;
  RequestId request = 0;
  int sample = 0;
  FinishReason reason = FinishReason::kLength;
  std::vector<int64_t> output;  // the tokens generated
};

// What complete() did: tokens appended (the first token of forked samples included) and the
// sequences that ended.
struct StepResult {
  struct Appended {
    SequenceId sequence;
    RequestId request;
    int sample;
    int64_t token;
    size_t chunk;  // sampled[chunk][draw] is the token
    int draw;
  };
  std::vector<Appended> appended;
  std::vector<FinishedSequence> finished;
};

class Scheduler {
 public:
  // `limits` must be valid (validate()).
  explicit Scheduler(const SchedulerLimits& limits);

  // Queues a request's prompt. Refused (nothing queued): an empty prompt, one that leaves no room
  // in max_model_len for a token, n < 1, and a sequence that could never fit the KV cache.
  StatusOr<RequestId> addRequest(RequestOptions request);

  // The next step's work; empty when nothing waits or runs. With a step not yet completed,
  // only where canScheduleAhead().
  ScheduledStep schedule();
  // Whether the next step can be scheduled while the last one runs: it would preempt nothing.
  bool canScheduleAhead() const;
  // Takes a step's drawn tokens back, steps in the order scheduled: sampled[i] holds chunk i's
  // `samples` tokens. Writes them in, forks the samples of prompts just computed, and ends the
  // sequences their stop rules end. Chunks of sequences ended meanwhile are skipped.
  StepResult complete(const ScheduledStep& step, const std::vector<std::vector<int64_t>>& sampled);

  // Ends a sequence between steps (a stop string matched in its text): its blocks are freed.
  FinishedSequence finish(SequenceId sequence, FinishReason reason);
  // Ends every sequence of a request, queued or running, and forgets the request. Every sample
  // is reported, those not yet forked from the prompt with sequence -1.
  std::vector<FinishedSequence> cancelRequest(RequestId request, FinishReason reason = FinishReason::kCancelled);

  // Null once the sequence has finished.
  const Sequence* sequence(SequenceId id) const;
  const SchedulerLimits& limits() const { return limits_; }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t numRunning() const { return static_cast<int64_t>(running_.size()); }
  int64_t numWaiting() const { return static_cast<int64_t>(waiting_.size()); }
  int32_t numBlocksUsed() const { return pool_.numUsed(); }
  int64_t numPreemptions() const { return preemptions_; }

 private:
  int64_t blocksFor(int64_t tokens) const { return (tokens + limits_.blockSize - 1) / limits_.blockSize; }
  // Blocks `s` takes to hold its first `tokens` tokens: new ones, and a copy of a shared last
  // block it would write into.
  int64_t blocksNeeded(const Sequence& s, int64_t tokens) const;
  void allocateBlocks(Sequence& s, int64_t tokens, ScheduledStep& step);
  // Makes room for `s` to hold `tokens` tokens by preempting the newest running sequences; false
  // when `s` itself was preempted.
  bool reserveBlocks(Sequence& s, int64_t tokens, ScheduledStep& step);
  void preempt(SequenceId id, ScheduledStep& step);
  void releaseBlocks(Sequence& s);
  // Sequences a running sequence stands for against max_num_seqs: itself and its samples still
  // to fork (pending or forking).
  int64_t runningSlots() const;
  // The reason the token at `index` ends `s`, if it does.
  bool stops(const Sequence& s, int64_t index, FinishReason* reason) const;
  // Whether a sequence of `s`'s holding `held` tokens has as many as it may: max_new_tokens of
  // output, or max_model_len in all.
  bool fullLength(const Sequence& s, int64_t held) const;
  FinishedSequence retire(SequenceId id, FinishReason reason);

  SchedulerLimits limits_;
  BlockPool pool_;
  std::unordered_map<SequenceId, Sequence> sequences_;
  std::vector<SequenceId> running_;  // in admission order: the last is the newest
  std::deque<SequenceId> waiting_;
  RequestId nextRequest_ = 0;
  SequenceId nextSequence_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace loom::rollout
