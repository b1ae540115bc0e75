#include "planner/rollout_router.h"

#include "planner/job_lifecycle.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

namespace {

JobRecord servedRollout() {
  JobRecord job;
  job.id = "r";
  job.spec.kind = JobKind::kRollout;
  job.spec.ranks = 1;
  job.spec.rollout.serve = true;
  job.state = JobState::kPending;
  return job;
}

RankReport ready(const JobRecord& job, const std::string& address) {
  return RankReport{.jobId = job.id, .attempt = job.attempt, .rank = 0, .event = RankEvent::kReady, .pid = 7,
                    .exitCode = 0, .signal = 0, .detail = "", .step = 0, .metrics = {}, .timeMs = 0,
                    .serviceAddress = address};
}

}  // namespace

TEST_CASE("rollout router: a served rollout's rank 0 address, or why there is none", "[planner]") {
  JobRecord job = servedRollout();
  auto pending = rolloutServiceAddress(job);
  CHECK(pending.status().code() == StatusCode::kUnavailable);
  CHECK(pending.status().message().find("job r is PENDING and its rank 0 does not serve yet") == 0);

  JobLifecycle::markPlaced(job, {NodeRanks{.nodeId = "n", .ranks = {0}}}, 1);
  JobLifecycle::applyRankReport(job, ready(job, ""), 2);
  CHECK(rolloutServiceAddress(job).status().code() == StatusCode::kUnavailable);  // running, model loading
  JobLifecycle::applyRankReport(job, ready(job, "10.0.0.5:41234"), 3);
  REQUIRE(rolloutServiceAddress(job).isOk());
  CHECK(*rolloutServiceAddress(job) == "10.0.0.5:41234");
  // Later reports without the address keep it.
  JobLifecycle::applyRankReport(job, ready(job, ""), 4);
  CHECK(job.ranks[0].serviceAddress == "10.0.0.5:41234");

  JobRecord batch = servedRollout();
  batch.spec.rollout.serve = false;
  CHECK(rolloutServiceAddress(batch).status().message().find("job r is a batch rollout") == 0);
  JobRecord train = servedRollout();
  train.spec.kind = JobKind::kTrain;
  CHECK(rolloutServiceAddress(train).status().message() ==
        "job r is a train job: RolloutService serves rollout jobs with rollout.serve true");
  JobRecord ended = servedRollout();
  ended.state = JobState::kCancelled;
  ended.reason = "cancelled by its user";
  CHECK(rolloutServiceAddress(ended).status().code() == StatusCode::kFailedPrecondition);
  CHECK(rolloutServiceAddress(ended).status().message() == "job r has ended CANCELLED: cancelled by its user");
}

TEST_CASE("rollout router: from_job_id names a train job that keeps checkpoints", "[planner]") {
  JobRecord train = servedRollout();
  train.spec.kind = JobKind::kTrain;
  CHECK(checkpointDirOfJob(train).status().message() ==
        "from_job_id: job r keeps no checkpoints (its train.checkpoint_dir is empty)");
  train.spec.train.checkpointDir = "/ckpt";
  REQUIRE(checkpointDirOfJob(train).isOk());
  CHECK(*checkpointDirOfJob(train) == "/ckpt");
  CHECK(checkpointDirOfJob(servedRollout()).status().message() == "from_job_id: job r is a rollout job, not a train job");
}
