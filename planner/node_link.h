#pragma once

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
};

}  // namespace loom::planner
