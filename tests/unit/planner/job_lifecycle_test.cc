#include "planner/job_lifecycle.h"

#include <csignal>

#include "common/process.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

namespace {

JobRecord newJob(int ranks, int maxRestarts) {
  JobRecord job;
  job.id = "j";
  job.spec.name = "j";
  job.spec.ranks = ranks;
  job.spec.maxRestarts = maxRestarts;
  job.state = JobState::kPending;
  return job;
}

Placement onOneNode(int ranks) {
  NodeRanks node{.nodeId = "n", .ranks = {}};
  for (int r = 0; r < ranks; ++r) node.ranks.push_back(r);
  return {node};
}

RankReport report(const JobRecord& job, int rank, RankEvent event, int exitCode = 0, int signal = 0) {
  return RankReport{.jobId = job.id, .attempt = job.attempt, .rank = rank, .event = event, .pid = 100 + rank,
                    .exitCode = exitCode, .signal = signal, .detail = "", .step = 0, .metrics = {}, .timeMs = 0};
}

void allReady(JobRecord& job) {
  for (int r = 0; r < job.spec.ranks; ++r) JobLifecycle::applyRankReport(job, report(job, r, RankEvent::kReady), 1);
}

void allExit(JobRecord& job, int signal) {
  for (auto& r : job.ranks) {
    if (r.state != RankState::kSucceeded && r.state != RankState::kFailed)
      JobLifecycle::applyRankReport(job, report(job, r.rank, RankEvent::kExited, 0, signal), 1);
  }
}

}  // namespace

TEST_CASE("placed -> running -> succeeded", "[planner]") {
  JobRecord job = newJob(2, 0);
  auto placed = JobLifecycle::markPlaced(job, onOneNode(2), 1);
  CHECK(job.state == JobState::kLaunching);
  CHECK(job.attempt == 1);
  REQUIRE(placed.events.size() == 1);
  allReady(job);
  CHECK(job.state == JobState::kRunning);
  JobLifecycle::applyRankReport(job, report(job, 0, RankEvent::kExited), 2);
  CHECK(job.state == JobState::kRunning);
  auto last = JobLifecycle::applyRankReport(job, report(job, 1, RankEvent::kExited), 3);
  CHECK(job.state == JobState::kSucceeded);
  CHECK(job.reason == "all 2 ranks exited 0");
  CHECK(last.attemptOver);
}

TEST_CASE("a killed rank with restarts left: RESTARTING - every rank stopped - then PENDING", "[planner]") {
  JobRecord job = newJob(2, 1);
  JobLifecycle::markPlaced(job, onOneNode(2), 1);
  allReady(job);
  auto failed = JobLifecycle::applyRankReport(job, report(job, 1, RankEvent::kExited, 0, SIGKILL), 2);
  CHECK(job.state == JobState::kRestarting);
  CHECK(failed.stopAttempt);
  CHECK(job.reason.find("rank 1 (pid 101 on node n) killed by SIGKILL") != std::string::npos);
  CHECK(job.reason.find("restarting (1 of 1)") != std::string::npos);
  auto stopped = JobLifecycle::applyRankReport(job, report(job, 0, RankEvent::kExited, 0, SIGTERM), 3);
  CHECK(job.state == JobState::kPending);
  CHECK(job.restarts == 1);
  CHECK(stopped.needsPlacement);
  JobLifecycle::markPlaced(job, onOneNode(2), 4);
  CHECK(job.attempt == 2);
  // A late report of attempt 1 changes nothing.
  RankReport stale = report(job, 0, RankEvent::kExited, 1);
  stale.attempt = 1;
  JobLifecycle::applyRankReport(job, stale, 5);
  CHECK(job.state == JobState::kLaunching);
  // The second failure uses the last restart up.
  allReady(job);
  JobLifecycle::applyRankReport(job, report(job, 0, RankEvent::kExited, 3), 6);
  CHECK(job.state == JobState::kFailed);
  CHECK(job.reason.find("rank 0 (pid 100 on node n) exit code 3") != std::string::npos);
  CHECK(job.reason.find("all 1 restarts used") != std::string::npos);
}

TEST_CASE("without restarts a failure is final at once", "[planner]") {
  JobRecord job = newJob(3, 0);
  JobLifecycle::markPlaced(job, onOneNode(3), 1);
  allReady(job);
  auto effects = JobLifecycle::applyRankReport(job, report(job, 2, RankEvent::kHeartbeatLost), 2);
  CHECK(job.state == JobState::kFailed);
  CHECK(effects.stopAttempt);
  CHECK_FALSE(effects.attemptOver);
  allExit(job, SIGTERM);
  CHECK(job.state == JobState::kFailed);  // the others' exits do not change the outcome
}

TEST_CASE("a preempted rank: RESTARTING, and the relaunch is not a restart", "[planner]") {
  JobRecord job = newJob(2, 0);  // no restarts: a failure would end the job
  JobLifecycle::markPlaced(job, onOneNode(2), 1);
  allReady(job);
  // The rank wrote its checkpoint after SIGTERM and exited kExitPreempted.
  auto preempted = JobLifecycle::applyRankReport(job, report(job, 0, RankEvent::kExited, process::kExitPreempted), 2);
  CHECK(job.state == JobState::kRestarting);
  CHECK(preempted.stopAttempt);
  CHECK(job.ranks[0].preempted());
  CHECK(job.reason ==
        "attempt 1 preempted: rank 0 (pid 100 on node n) preempted: stopped after SIGTERM; restarting (preemption 1, "
        "not counted against restart.max_restarts)");
  auto relaunch = JobLifecycle::applyRankReport(job, report(job, 1, RankEvent::kExited, process::kExitPreempted), 3);
  CHECK(job.state == JobState::kPending);
  CHECK(relaunch.needsPlacement);
  CHECK(job.reason == "waiting for slots to relaunch after preemption 1");
  CHECK(job.restarts == 0);
  CHECK(job.preemptions == 1);

  // Killed by SIGTERM (a kind with nothing to save keeps the default action) is a preemption too.
  JobLifecycle::markPlaced(job, onOneNode(2), 4);
  allReady(job);
  JobLifecycle::applyRankReport(job, report(job, 1, RankEvent::kExited, 0, SIGTERM), 5);
  CHECK(job.state == JobState::kRestarting);
  allExit(job, SIGTERM);
  CHECK(job.state == JobState::kPending);
  CHECK(job.preemptions == 2);
  CHECK(job.restarts == 0);

  // A failure after that still ends the job: preemptions used none of its restarts.
  JobLifecycle::markPlaced(job, onOneNode(2), 6);
  allReady(job);
  JobLifecycle::applyRankReport(job, report(job, 1, RankEvent::kExited, 0, SIGKILL), 7);
  CHECK(job.state == JobState::kFailed);
  CHECK(job.reason.find("attempt 3 failed: rank 1 (pid 101 on node n) killed by SIGKILL; no restarts allowed") !=
        std::string::npos);
}

TEST_CASE("restart.on_preemption false: a preemption counts as a failure", "[planner]") {
  JobRecord job = newJob(1, 1);
  job.spec.restartOnPreemption = false;
  JobLifecycle::markPlaced(job, onOneNode(1), 1);
  allReady(job);
  JobLifecycle::applyRankReport(job, report(job, 0, RankEvent::kExited, process::kExitPreempted), 2);
  CHECK(job.state == JobState::kPending);
  CHECK(job.restarts == 1);
  CHECK(job.preemptions == 0);
  JobLifecycle::markPlaced(job, onOneNode(1), 3);
  allReady(job);
  JobLifecycle::applyRankReport(job, report(job, 0, RankEvent::kExited, process::kExitPreempted), 4);
  CHECK(job.state == JobState::kFailed);
  CHECK(job.reason.find("attempt 2 preempted (restart.on_preemption is false)") != std::string::npos);
}

TEST_CASE("a drained node preempts the attempt: every rank stopped, relaunched without counting", "[planner]") {
  JobRecord job = newJob(2, 0);
  JobLifecycle::markPlaced(job, onOneNode(2), 1);
  allReady(job);
  auto drained = JobLifecycle::preempt(job, "node n is drained", 2);
  CHECK(job.state == JobState::kRestarting);
  CHECK(drained.stopAttempt);
  CHECK(job.reason.find("attempt 1 preempted: node n is drained") == 0);
  // However the ranks end (a grace period too short for a checkpoint: SIGKILL), the relaunch is free.
  allExit(job, SIGKILL);
  CHECK(job.state == JobState::kPending);
  CHECK(job.restarts == 0);
  CHECK(job.preemptions == 1);
  CHECK(JobLifecycle::preempt(job, "again", 3).events.empty());  // nothing runs: nothing to preempt
}

TEST_CASE("a rank's notice is an event of the job's, in its state, its reason unchanged", "[planner]") {
  JobRecord job = newJob(2, 0);
  JobLifecycle::markPlaced(job, onOneNode(2), 1);
  allReady(job);
  const std::string reason = job.reason;
  RankReport notice = report(job, 0, RankEvent::kProgress);
  notice.detail = "checkpoint refused, an older one is used: ckpt/global_step6: ...";
  auto effects = JobLifecycle::applyRankReport(job, notice, 2);
  REQUIRE(effects.events.size() == 1);
  CHECK(effects.events[0].state == JobState::kRunning);
  CHECK(effects.events[0].reason == "rank 0: checkpoint refused, an older one is used: ckpt/global_step6: ...");
  CHECK(job.state == JobState::kRunning);
  CHECK(job.reason == reason);
  CHECK(JobLifecycle::applyRankReport(job, report(job, 0, RankEvent::kProgress), 3).events.empty());
}

TEST_CASE("a rank lost with its node fails the attempt", "[planner]") {
  JobRecord job = newJob(2, 0);
  JobLifecycle::markPlaced(job, onOneNode(2), 1);
  allReady(job);
  JobLifecycle::markRankLost(job, 0, "node n lost contact 15 s ago", 2);
  CHECK(job.state == JobState::kFailed);
  CHECK(job.reason.find("node n lost contact") != std::string::npos);
}

TEST_CASE("cancel: PENDING ends at once - a running job waits for its ranks", "[planner]") {
  JobRecord pending = newJob(1, 0);
  auto effects = JobLifecycle::requestCancel(pending, "", 1);
  REQUIRE(effects.isOk());
  CHECK(pending.state == JobState::kCancelled);
  CHECK(JobLifecycle::requestCancel(pending, "", 2).status().code() == StatusCode::kFailedPrecondition);

  JobRecord running = newJob(2, 3);
  JobLifecycle::markPlaced(running, onOneNode(2), 1);
  allReady(running);
  auto cancel = JobLifecycle::requestCancel(running, "user asked", 2);
  REQUIRE(cancel.isOk());
  CHECK(cancel->stopAttempt);
  CHECK(running.state == JobState::kCancelling);
  allExit(running, SIGTERM);
  CHECK(running.state == JobState::kCancelled);  // not restarted, whatever max_restarts says
  CHECK(running.reason == "cancelled: user asked; every rank stopped");
}

TEST_CASE("waiting reasons are recorded only when they change", "[planner]") {
  JobRecord job = newJob(4, 0);
  CHECK(JobLifecycle::markWaiting(job, "waiting for 4 free slots", 1).events.size() == 1);
  CHECK(JobLifecycle::markWaiting(job, "waiting for 4 free slots", 2).events.empty());
  CHECK(job.lastEventSeq == 1);
}
