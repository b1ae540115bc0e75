#pragma once

#include <string>

#include "common/status.h"

namespace loom::worker {

// SIGTERM as a preemption (a node drained, a pod evicted, a scheduler's preemption): from this
// call on, SIGTERM only raises a flag, which a job that can save its state polls at a safe point
// (a train job between steps: it writes a checkpoint, then the rank exits
// process::kExitPreempted). A job kind that never calls this keeps SIGTERM's default action.
void catchPreemption();
// Whether SIGTERM arrived since catchPreemption(); safe from any thread.
bool preemptionRequested();

// What a runner returns when it stopped for a preemption (on every rank, including those that
// learned of it from the others): ABORTED, which the worker's main turns into kExitPreempted.
inline Status preemptedStatus(const std::string& what) { return Status(StatusCode::kAborted, what); }
inline bool isPreemptedStatus(const Status& status) { return status.code() == StatusCode::kAborted; }

}  // namespace loom::worker
