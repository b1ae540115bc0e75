#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "planner/rollout_spec.h"
#include "worker/rollout/scheduler.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/rollout/decode_graphs.h"
#include "worker/torch/rollout/rollout_group.h"
#include "worker/torch/rollout/sampler.h"
#include "worker/torch/rollout/step_batch.h"
#include "worker/torch/rollout/warm_up.h"

namespace loom::worker {

struct EngineOptions {
  rollout::SchedulerLimits limits;
  std::vector<int64_t> eosTokenIds;  // the model's end of sequence, for every request
  bool cudaGraphs = false;           // decode steps as CUDA graphs where the model can (decode_graphs.h)
  // The next step scheduled and launched while this one runs (scheduler.h); one rank only.
  bool asyncScheduling = true;
  // Tensor parallelism: this is rank 0 of the group, which sends each step to the others (which
  // follow it, RolloutGroup::follow) and gathers the vocabulary's logits. Null on one rank.
  RolloutGroup* group = nullptr;
};

// A token drawn for a request's sample in a step.
struct TokenEvent {
  rollout::RequestId request = 0;
  int sample = 0;
  rollout::SequenceId sequence = 0;
  DrawnToken drawn;
};

struct StepEvents {
  std::vector<TokenEvent> tokens;  // in the order drawn
  std::vector<rollout::FinishedSequence> finished;
  int64_t computedTokens = 0;  // every token the step computed; 0: nothing was scheduled
  int64_t promptTokens = 0;    // of those, in chunks of more than one token (recomputations included)
};

// Continuous-batching generation on one rank: the scheduler's steps run through the model over
// the paged KV cache, and each request's samples draw their tokens with their own generators.
// With asynchronous scheduling, a step is launched before the one before it has come back, so
// that the host's work between two steps (drawing's results, the scheduler, the next batch)
// runs while the device computes. One thread owns it (the rollout loop).
class RolloutEngine {
 public:
  RolloutEngine(DecoderModel& model, PagedKvCache cache, EngineOptions options);
  bool cudaGraphs() const { return graphs_ != nullptr; }
  bool asyncScheduling() const { return options_.asyncScheduling && !options_.group; }
  // Before the first request: the first steps' lazy costs and every decode graph (warm_up.h).
  // Returns the number of graphs captured; nothing under tensor parallelism or off a GPU, where
  // it does not warm up.
  std::optional<int64_t> warmUp();

  // `cache` holds limits.numBlocks blocks and one more, the scratch block of padded graph rows.
  // Queues a prompt of token ids. `seed` is the request's when its params have none. Refused,
  // naming the field: ids outside the vocabulary, and what the scheduler refuses.
  StatusOr<rollout::RequestId> addRequest(std::vector<int64_t> prompt, const planner::SamplingParams& params,
                                          uint64_t seed);
  // Computes a step and draws its tokens: the step launched by the call before (with
  // asynchronous scheduling, having launched the next one first), or a step scheduled now.
  // Nothing when idle. `launchMore` false: only the step already launched, if any (paused).
  StepEvents step(bool launchMore = true);
  // Ends a sample early (a stop string) or every sample of a request (cancelled by its client,
  // or aborted by a weight update).
  rollout::FinishedSequence finish(rollout::SequenceId sequence, rollout::FinishReason reason);
  std::vector<rollout::FinishedSequence> cancel(rollout::RequestId request,
                                                rollout::FinishReason reason = rollout::FinishReason::kCancelled);

  const rollout::Scheduler& scheduler() const { return scheduler_; }
  bool idle() const { return scheduler_.idle() && !inFlight_; }
  bool stepInFlight() const { return inFlight_ != nullptr; }

 private:
  struct RequestState {
    planner::SamplingParams params;
    std::vector<at::Generator> generators;  // one per sample
    int live = 0;                           // samples not finished
  };
  // A step on the device whose tokens have not been taken back.
  struct InFlight {
    rollout::ScheduledStep step;
    std::vector<size_t> firstDraw;  // chunk i's draws start there
    LaunchedDraws draws;
    PendingRows rowOf;  // each drawing sequence's own row of draws.tokens
  };
  std::unique_ptr<InFlight> launch(rollout::ScheduledStep step);
  StepEvents collect(InFlight& done);
  void forget(const std::vector<rollout::FinishedSequence>& finished);

  DecoderModel& model_;
  PagedKvCache cache_;
  EngineOptions options_;
  rollout::Scheduler scheduler_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: every step runs eagerly
  std::unordered_map<rollout::RequestId, RequestState> requests_;
  std::unique_ptr<InFlight> inFlight_;
};

}  // namespace loom::worker
