#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/job.h"

namespace loom::planner {

// What the caller must do after a lifecycle step. The lifecycle itself does no I/O.
struct LifecycleEffects {
  std::vector<JobEvent> events;  // to persist and to show watchers, in order
  bool stopAttempt = false;      // stop every rank of the current attempt (a signal, grace, SIGKILL)
  bool stopPreempts = false;     // ... with SIGTERM, on which train ranks checkpoint (KillOrder::preempt)
  std::string stopReason;
  bool attemptOver = false;      // every rank of the attempt has ended: nodes may forget it
  bool needsPlacement = false;   // the job is PENDING again and waits for slots
};

// The job state machine of ARCHITECTURE.md, as pure functions over a JobRecord:
//   PENDING -> LAUNCHING -> RUNNING -> SUCCEEDED
//   a failed rank -> RESTARTING (restarts left; PENDING again once all ranks ended) or FAILED
//   a preempted rank -> RESTARTING, not counted against max_restarts (spec.restartOnPreemption)
//   cancel -> CANCELLING -> CANCELLED (once every rank has ended)
class JobLifecycle {
 public:
  // The job got its slots: a new attempt starts.
  static LifecycleEffects markPlaced(JobRecord& job, const Placement& placement, int64_t nowMs);
  // A PENDING job that still does not fit; records the reason only when it changed.
  static LifecycleEffects markWaiting(JobRecord& job, const std::string& reason, int64_t nowMs);
  static LifecycleEffects applyRankReport(JobRecord& job, const RankReport& report, int64_t nowMs);
  // A rank the planner can no longer see (its node went away): it failed.
  static LifecycleEffects markRankLost(JobRecord& job, int rank, const std::string& why, int64_t nowMs);
  // The attempt is preempted from outside (its node is drained): every rank is stopped (SIGTERM,
  // so that a train rank checkpoints), and the job relaunches as after a rank's own preemption.
  // Nothing to do unless the attempt is launching or running.
  static LifecycleEffects preempt(JobRecord& job, const std::string& why, int64_t nowMs);
  // FailedPrecondition when the job already ended.
  static StatusOr<LifecycleEffects> requestCancel(JobRecord& job, const std::string& reason, int64_t nowMs);

 private:
  static void transition(JobRecord& job, JobState to, std::string reason, int64_t nowMs, LifecycleEffects& out);
  // An event that changes neither the state nor the job's reason.
  static void record(JobRecord& job, std::string what, int64_t nowMs, LifecycleEffects& out);
  // `ended`: why the attempt ends, if it does (a rank failed, or was preempted).
  struct AttemptEnd {
    std::string why;
    bool preempted = false;
  };
  static void evaluate(JobRecord& job, const AttemptEnd& ended, int64_t nowMs, LifecycleEffects& out);
};

}  // namespace loom::planner
