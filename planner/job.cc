#include "planner/job.h"

#include "common/process.h"

namespace loom::planner {

const char* jobStateName(JobState state) {
  switch (state) {
    case JobState::kPending: return "PENDING";
    case JobState::kLaunching: return "LAUNCHING";
    case JobState::kRunning: return "RUNNING";
    case JobState::kRestarting: return "RESTARTING";
    case JobState::kCancelling: return "CANCELLING";
    case JobState::kSucceeded: return "SUCCEEDED";
    case JobState::kFailed: return "FAILED";
    case JobState::kCancelled: return "CANCELLED";
  }
  return "?";
}

const char* rankStateName(RankState state) {
  switch (state) {
    case RankState::kLaunching: return "LAUNCHING";
    case RankState::kRunning: return "RUNNING";
    case RankState::kSucceeded: return "SUCCEEDED";
    case RankState::kFailed: return "FAILED";
  }
  return "?";
}

bool RankStatus::preempted() const {
  return process::isPreemption(process::ExitInfo{.exitCode = exitCode, .signal = signal});
}

bool isFinal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed || state == JobState::kCancelled;
}

bool hasLiveAttempt(JobState state) {
  return state == JobState::kLaunching || state == JobState::kRunning || state == JobState::kRestarting ||
         state == JobState::kCancelling;
}

}  // namespace loom::planner
