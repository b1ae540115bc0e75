#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "planner/rollout_spec.h"
#include "worker/rollout/drawn_token.h"
#include "worker/rollout/scheduler.h"

namespace loom::rollout {

// Where a served rollout's two sides meet: the RPC threads of the rollout service post requests,
// cancellations, weight updates and pauses; the engine loop takes them between steps and feeds
// each request's sink. Plain structs only, so the service (which speaks protobuf) and the
// engine (which speaks libtorch) never include each other.

// A request as the service hands it over: its prompt and its sampling, read over the rollout's
// defaults.
struct ServedPrompt {
  bool isText = false;
  std::string text;
  std::vector<int64_t> tokenIds;
  planner::SamplingParams sampling;
};

// One request's stream, fed on the engine loop's thread: accepted, then its samples' tokens and
// finishes, then done; or failed, alone, when the request is refused. Implementations must not
// block (they hand the events to their transport).
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void accepted(const std::vector<int64_t>& promptTokenIds, int64_t weightsVersion) = 0;
  // `text`: what the token adds to the sample's text that no stop string can still cut.
  virtual void token(int sample, const DrawnToken& token, std::string_view text) = 0;
  // `text`: the rest of the sample's text, held back until now.
  virtual void finished(int sample, FinishReason reason, std::string_view text) = 0;
  virtual void done() = 0;
  virtual void failed(const Status& status) = 0;
};

// The served rollout as the loop last published it.
struct RolloutStatusView {
  int64_t weightsVersion = 0;
  std::string weightsSource;
  bool paused = false;
  int64_t requestsRunning = 0;
  int64_t requestsWaiting = 0;  // queued in the scheduler, or held while weights are swapped
  int64_t kvBlocksUsed = 0;
  int64_t kvBlocksTotal = 0;
  int64_t preemptions = 0;
  int64_t requestsServed = 0;
  int64_t outputTokens = 0;
  int64_t updatesPending = 0;  // weight updates waiting for the requests in flight
};

using StatusReply = std::function<void(const StatusOr<RolloutStatusView>&)>;

// UpdateWeights: the directory of safetensors to load, what becomes of requests in flight, and
// the version the new weights serve as (0: one more than now).
struct WeightsOrder {
  std::string dir;
  bool abortInFlight = false;
  int64_t version = 0;
  StatusReply reply;
};

struct PauseOrder {
  bool pause = true;  // false: resume
  StatusReply reply;
};

class RolloutInbox {
 public:
  using Handle = uint64_t;

  // ---- the service's side (any thread) ----
  Handle submit(ServedPrompt prompt, std::shared_ptr<RequestSink> sink);
  void cancel(Handle handle);
  void updateWeights(WeightsOrder order);
  void setPaused(PauseOrder order);  // Pause or Resume
  RolloutStatusView status() const;

  // ---- the engine loop's side ----
  struct Submission {
    Handle handle = 0;
    ServedPrompt prompt;
    std::shared_ptr<RequestSink> sink;
  };
  struct Commands {
    std::vector<Submission> submitted;
    std::vector<Handle> cancelled;
    std::vector<WeightsOrder> updates;
    std::vector<PauseOrder> pauses;
    bool empty() const { return submitted.empty() && cancelled.empty() && updates.empty() && pauses.empty(); }
  };
  // What was posted since the last call; when nothing was, waits up to `wait` for something.
  Commands take(std::chrono::milliseconds wait);
  void publish(const RolloutStatusView& status);

 private:
  mutable std::mutex mu_;
  std::condition_variable posted_;
  Handle nextHandle_ = 1;
  Commands pending_;
  RolloutStatusView status_;
};

}  // namespace loom::rollout
