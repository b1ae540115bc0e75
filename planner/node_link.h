#pragma once

#include <atomic>
#include <cstdint>

#include "common/node_messages.h"
#include "common/status.h"

namespace loom::planner {

// The planner's side of one node daemon's Attach stream: orders go down through it. Sends are
// queued and never block; after close() or a broken stream they are dropped (the daemon
// re-registers and the planner reconciles). Thread-safe.
class NodeLink {
 public:
  virtual ~NodeLink() = default;
  virtual void launch(const LaunchOrder& order) = 0;
  virtual void kill(const KillOrder& order) = 0;
  virtual void release(const ReleaseOrder& order) = 0;
  virtual void requestLogs(const LogQuery& query) = 0;
  virtual void cancelLogs(int64_t requestId) = 0;
  // Ends the stream with `why` (OK: the node is considered gone; an error: it is refused).
  virtual void close(const Status& why) = 0;

  // When the daemon last spoke on this stream (its registration, a heartbeat, a report), in
  // monotonic and wall-clock milliseconds. Written on the stream's thread and read by the
  // planner's loop, so that a heartbeat (a thousand a second at a thousand nodes) costs the loop
  // nothing.
  void heard(int64_t steadyMs, int64_t wallMs) {
    heardSteadyMs_.store(steadyMs, std::memory_order_relaxed);
    heardWallMs_.store(wallMs, std::memory_order_relaxed);
  }
  int64_t heardSteadyMs() const { return heardSteadyMs_.load(std::memory_order_relaxed); }
  int64_t heardWallMs() const { return heardWallMs_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> heardSteadyMs_{0};
  std::atomic<int64_t> heardWallMs_{0};
};

}  // namespace loom::planner
