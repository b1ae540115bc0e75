#include "planner/job_lifecycle.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/process.h"

namespace loom::planner {

namespace {

bool isTerminal(RankState s) { return s == RankState::kSucceeded || s == RankState::kFailed; }

std::string describeRank(const RankStatus& r) {
  std::string where = r.pid > 0 ? fmt::format("pid {} on node {}", r.pid, r.nodeId) : fmt::format("node {}", r.nodeId);
  return fmt::format("rank {} ({})", r.rank, where);
}

std::string describePlacement(const Placement& placement) {
  std::string out;
  for (const auto& node : placement) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} ({} rank{})", node.nodeId, node.ranks.size(), node.ranks.size() == 1 ? "" : "s");
  }
  return out;
}

}  // namespace

void JobLifecycle::transition(JobRecord& job, JobState to, std::string reason, int64_t nowMs,
                              LifecycleEffects& out) {
  job.state = to;
  job.reason = std::move(reason);
  job.updateTimeMs = nowMs;
  JobEvent event{.seq = ++job.lastEventSeq, .timeMs = nowMs, .state = to, .attempt = job.attempt, .reason = job.reason};
  out.events.push_back(event);
}

void JobLifecycle::record(JobRecord& job, std::string what, int64_t nowMs, LifecycleEffects& out) {
  job.updateTimeMs = nowMs;
  out.events.push_back(
      JobEvent{.seq = ++job.lastEventSeq, .timeMs = nowMs, .state = job.state, .attempt = job.attempt, .reason = std::move(what)});
}

LifecycleEffects JobLifecycle::markPlaced(JobRecord& job, const Placement& placement, int64_t nowMs) {
  LifecycleEffects out;
  job.attempt += 1;
  job.ranks.assign(job.spec.ranks, RankStatus{});
  for (const auto& node : placement) {
    for (int rank : node.ranks) {
      job.ranks[rank].rank = rank;
      job.ranks[rank].nodeId = node.nodeId;
    }
  }
  transition(job, JobState::kLaunching,
             fmt::format("attempt {}: launching {} rank{} on {}", job.attempt, job.spec.ranks,
                         job.spec.ranks == 1 ? "" : "s", describePlacement(placement)),
             nowMs, out);
  return out;
}

LifecycleEffects JobLifecycle::markWaiting(JobRecord& job, const std::string& reason, int64_t nowMs) {
  LifecycleEffects out;
  if (job.state == JobState::kPending && job.reason != reason) transition(job, JobState::kPending, reason, nowMs, out);
  return out;
}

LifecycleEffects JobLifecycle::applyRankReport(JobRecord& job, const RankReport& report, int64_t nowMs) {
  LifecycleEffects out;
  if (report.attempt != job.attempt || report.rank < 0 || report.rank >= static_cast<int>(job.ranks.size()))
    return out;  // a late report of an earlier attempt: its outcome is already recorded
  RankStatus& rank = job.ranks[report.rank];
  if (report.pid > 0) rank.pid = report.pid;
  if (!report.serviceAddress.empty()) rank.serviceAddress = report.serviceAddress;
  if (isTerminal(rank.state)) {
    // The process may be reaped after a heartbeat loss was already recorded: keep the first cause.
    if (report.event == RankEvent::kExited && rank.exitCode == 0 && rank.signal == 0) {
      rank.exitCode = report.exitCode;
      rank.signal = report.signal;
    }
    evaluate(job, {}, nowMs, out);
    return out;
  }

  AttemptEnd ended;
  switch (report.event) {
    case RankEvent::kStarted:
      break;
    case RankEvent::kReady:
      rank.state = RankState::kRunning;
      break;
    case RankEvent::kProgress:
      rank.state = RankState::kRunning;
      rank.step = std::max(rank.step, report.step);
      // A rank's notice (ReportClient::notice): an event in the job's history, in its state.
      if (!report.detail.empty()) record(job, fmt::format("rank {}: {}", report.rank, report.detail), nowMs, out);
      for (const auto& [name, value] : report.metrics) rank.metrics[name] = value;
      // Rank 0's metrics are the job's (the others report the same quantities).
      if (report.rank == 0) {
        for (const auto& [name, value] : report.metrics) job.metrics[name] = value;
      }
      break;
    case RankEvent::kExited: {
      rank.exitCode = report.exitCode;
      rank.signal = report.signal;
      process::ExitInfo exit{.exitCode = report.exitCode, .signal = report.signal};
      if (report.signal == 0 && report.exitCode == 0) {
        rank.state = RankState::kSucceeded;
      } else {
        rank.state = RankState::kFailed;
        rank.detail = process::describeExit(exit);
        if (!report.detail.empty()) rank.detail += " (" + report.detail + ")";
        ended = {.why = describeRank(rank) + " " + rank.detail, .preempted = rank.preempted()};
      }
      break;
    }
    case RankEvent::kHeartbeatLost:
    case RankEvent::kLaunchFailed:
      rank.state = RankState::kFailed;
      rank.detail = report.detail;
      ended.why = describeRank(rank) + ": " + report.detail;
      break;
  }
  job.updateTimeMs = nowMs;
  evaluate(job, ended, nowMs, out);
  return out;
}

LifecycleEffects JobLifecycle::markRankLost(JobRecord& job, int rank, const std::string& why, int64_t nowMs) {
  LifecycleEffects out;
  if (rank < 0 || rank >= static_cast<int>(job.ranks.size())) return out;
  RankStatus& status = job.ranks[rank];
  if (isTerminal(status.state)) return out;
  status.state = RankState::kFailed;
  status.detail = why;
  evaluate(job, {.why = describeRank(status) + ": " + why}, nowMs, out);
  return out;
}

LifecycleEffects JobLifecycle::preempt(JobRecord& job, const std::string& why, int64_t nowMs) {
  LifecycleEffects out;
  if (job.state == JobState::kLaunching || job.state == JobState::kRunning)
    evaluate(job, {.why = why, .preempted = true}, nowMs, out);
  return out;
}

StatusOr<LifecycleEffects> JobLifecycle::requestCancel(JobRecord& job, const std::string& reason, int64_t nowMs) {
  LifecycleEffects out;
  std::string why = reason.empty() ? "cancelled by request" : "cancelled: " + reason;
  switch (job.state) {
    case JobState::kSucceeded:
    case JobState::kFailed:
    case JobState::kCancelled:
      return failedPrecondition("job {} already ended {}", job.id, jobStateName(job.state));
    case JobState::kCancelling:
      return out;
    case JobState::kPending:
      transition(job, JobState::kCancelled, why, nowMs, out);
      return out;
    case JobState::kLaunching:
    case JobState::kRunning:
    case JobState::kRestarting:
      transition(job, JobState::kCancelling, why + "; stopping every rank", nowMs, out);
      out.stopAttempt = true;
      out.stopReason = why;
      evaluate(job, {}, nowMs, out);
      return out;
  }
  return out;
}

void JobLifecycle::evaluate(JobRecord& job, const AttemptEnd& ended, int64_t nowMs, LifecycleEffects& out) {
  const int n = static_cast<int>(job.ranks.size());
  int running = 0, succeeded = 0, over = 0;
  for (const auto& r : job.ranks) {
    running += r.state == RankState::kRunning;
    succeeded += r.state == RankState::kSucceeded;
    over += isTerminal(r.state);
  }
  const bool allEnded = over == n;

  switch (job.state) {
    case JobState::kLaunching:
    case JobState::kRunning:
      if (ended.preempted && job.spec.restartOnPreemption) {
        job.preemptions += 1;
        job.preemptedAttempt = job.attempt;
        transition(job, JobState::kRestarting,
                   fmt::format("attempt {} preempted: {}; restarting (preemption {}, not counted against "
                               "restart.max_restarts)",
                               job.attempt, ended.why, job.preemptions),
                   nowMs, out);
        out.stopAttempt = true;
        out.stopPreempts = true;
        out.stopReason = "preempted: " + ended.why;
        break;
      }
      if (!ended.why.empty()) {
        const std::string what = ended.preempted ? "preempted (restart.on_preemption is false)" : "failed";
        if (job.restarts < job.spec.maxRestarts) {
          transition(job, JobState::kRestarting,
                     fmt::format("attempt {} {}: {}; restarting ({} of {})", job.attempt, what, ended.why,
                                 job.restarts + 1, job.spec.maxRestarts),
                     nowMs, out);
        } else {
          std::string tail = job.spec.maxRestarts == 0
                                 ? std::string("no restarts allowed")
                                 : fmt::format("all {} restarts used", job.spec.maxRestarts);
          transition(job, JobState::kFailed, fmt::format("attempt {} {}: {}; {}", job.attempt, what, ended.why, tail),
                     nowMs, out);
        }
        out.stopAttempt = true;
        out.stopPreempts = ended.preempted;
        out.stopReason = ended.why;
        break;
      }
      if (job.state == JobState::kLaunching && running + succeeded == n)
        transition(job, JobState::kRunning, fmt::format("attempt {}: all {} ranks running", job.attempt, n), nowMs, out);
      if (succeeded == n)
        transition(job, JobState::kSucceeded, fmt::format("all {} ranks exited 0", n), nowMs, out);
      break;
    case JobState::kRestarting:  // after the switch: also when the rank that ended the attempt was its last
      break;
    case JobState::kCancelling:
      if (allEnded) {
        std::string why = job.reason;
        auto pos = why.find("; stopping every rank");
        if (pos != std::string::npos) why.erase(pos);
        transition(job, JobState::kCancelled, why + "; every rank stopped", nowMs, out);
      }
      break;
    case JobState::kPending:
    case JobState::kSucceeded:
    case JobState::kFailed:
    case JobState::kCancelled:
      break;
  }
  if (job.state == JobState::kRestarting && allEnded) {
    if (job.preemptedAttempt == job.attempt) {
      transition(job, JobState::kPending,
                 fmt::format("waiting for slots to relaunch after preemption {}", job.preemptions), nowMs, out);
    } else {
      job.restarts += 1;
      transition(job, JobState::kPending,
                 fmt::format("waiting for slots to relaunch (restart {} of {})", job.restarts, job.spec.maxRestarts),
                 nowMs, out);
    }
    out.needsPlacement = true;
  }
  if (allEnded && n > 0 && job.state != JobState::kRestarting) out.attemptOver = true;
}

}  // namespace loom::planner
