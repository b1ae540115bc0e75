#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "planner/rollout_spec.h"
#include "worker/rollout/scheduler.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/rollout/decode_graphs.h"
#include "worker/torch/rollout/rollout_group.h"
#include "worker/torch/rollout/sampler.h"
#include "worker/torch/rollout/warm_up.h"

namespace loom::worker {

struct EngineOptions {
  rollout::SchedulerLimits limits;
  std::vector<int64_t> eosTokenIds;  // the model's end of sequence, for every request
  bool cudaGraphs = false;           // decode steps as CUDA graphs where the model can (decode_graphs.h)
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
// One thread owns it (the rollout loop).
class RolloutEngine {
 public:
  RolloutEngine(DecoderModel& model, PagedKvCache cache, EngineOptions options);
  bool cudaGraphs() const { return graphs_ != nullptr; }
  // Before the first request: the first steps' lazy costs and every decode graph (warm_up.h).
  // Nothing under tensor parallelism or off a GPU. Returns the number of graphs captured.
  int64_t warmUp();

  // `cache` holds limits.numBlocks blocks and one more, the scratch block of padded graph rows.
  // Queues a prompt of token ids. `seed` is the request's when its params have none. Refused,
  // naming the field: ids outside the vocabulary, and what the scheduler refuses.
  StatusOr<rollout::RequestId> addRequest(std::vector<int64_t> prompt, const planner::SamplingParams& params,
                                          uint64_t seed);
  // Schedules a step, computes it and draws its tokens; nothing when idle.
  StepEvents step();
  // Ends a sample early (a stop string) or every sample of a request (cancelled by its client,
  // or aborted by a weight update).
  rollout::FinishedSequence finish(rollout::SequenceId sequence, rollout::FinishReason reason);
  std::vector<rollout::FinishedSequence> cancel(rollout::RequestId request,
                                                rollout::FinishReason reason = rollout::FinishReason::kCancelled);

  const rollout::Scheduler& scheduler() const { return scheduler_; }
  bool idle() const { return scheduler_.idle(); }

 private:
  struct RequestState {
    planner::SamplingParams params;
    std::vector<at::Generator> generators;  // one per sample
    int live = 0;                           // samples not finished
  };
  void forget(const std::vector<rollout::FinishedSequence>& finished);

  DecoderModel& model_;
  PagedKvCache cache_;
  EngineOptions options_;
  rollout::Scheduler scheduler_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: every step runs eagerly
  std::unordered_map<rollout::RequestId, RequestState> requests_;
};

}  // namespace loom::worker
