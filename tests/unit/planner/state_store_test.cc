#include "planner/state_store.h"

#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::planner;

namespace {

JobRecord sampleJob(const std::string& id, const std::string& requestId) {
  JobRecord job;
  job.id = id;
  job.requestId = requestId;
  job.spec = parseJobSpec(R"({"name": "p", "kind": "probe", "resources": {"ranks": 2}})").value();
  job.specJson = job.spec.toJson().dump();
  job.state = JobState::kRunning;
  job.reason = "running";
  job.attempt = 1;
  job.ranks = {RankStatus{.rank = 0, .nodeId = "n", .pid = 7, .state = RankState::kRunning, .exitCode = 0,
                          .signal = 0, .detail = "", .step = 3},
               RankStatus{.rank = 1, .nodeId = "n", .pid = 8, .state = RankState::kFailed, .exitCode = 0,
                          .signal = 9, .detail = "killed by SIGKILL", .step = 2}};
  job.metrics = {{"probe.tick", 3}};
  job.lastEventSeq = 1;
  return job;
}

}  // namespace

TEST_CASE("jobs - events and metrics survive reopening the database", "[planner]") {
  loom::testing::TempDir dir;
  const std::string path = dir.path() + "/planner.db";
  {
    auto store = StateStore::open(path);
    REQUIRE(store.isOk());
    JobRecord job = sampleJob("a", "req-1");
    REQUIRE((*store)->insertJob(job, {JobEvent{.seq = 1, .timeMs = 10, .state = JobState::kPending, .attempt = 0,
                                               .reason = "created"}})
                .isOk());
    job.state = JobState::kSucceeded;
    job.lastEventSeq = 2;
    REQUIRE((*store)->updateJob(job, {JobEvent{.seq = 2, .timeMs = 20, .state = JobState::kSucceeded, .attempt = 1,
                                               .reason = "done"}})
                .isOk());
    REQUIRE((*store)->appendMetrics("a", {Metric{.attempt = 1, .rank = 0, .step = 1, .name = "m", .value = 0.5,
                                                 .timeMs = 11}})
                .isOk());
  }
  auto store = StateStore::open(path);
  REQUIRE(store.isOk());
  auto jobs = (*store)->loadJobs();
  REQUIRE(jobs.isOk());
  REQUIRE(jobs->size() == 1);
  const JobRecord& job = (*jobs)[0];
  CHECK(job.id == "a");
  CHECK(job.requestId == "req-1");
  CHECK(job.state == JobState::kSucceeded);
  CHECK(job.ranks.size() == 2);
  CHECK(job.ranks[1].signal == 9);
  CHECK(job.ranks[1].detail == "killed by SIGKILL");
  CHECK(job.metrics.at("probe.tick") == 3);
  CHECK(job.spec.ranks == 2);
  auto events = (*store)->loadEvents("a");
  REQUIRE(events->size() == 2);
  CHECK((*events)[1].reason == "done");
  auto metrics = (*store)->loadMetrics("a", 10);
  REQUIRE(metrics->size() == 1);
  CHECK((*metrics)[0].value == 0.5);
}

TEST_CASE("a taken request id or job id is ALREADY_EXISTS and stores nothing", "[planner]") {
  loom::testing::TempDir dir;
  auto store = StateStore::open(dir.path() + "/planner.db");
  REQUIRE(store.isOk());
  REQUIRE((*store)->insertJob(sampleJob("a", "req"), {}).isOk());
  auto dupRequest = (*store)->insertJob(sampleJob("b", "req"), {JobEvent{.seq = 1}});
  CHECK(dupRequest.code() == StatusCode::kAlreadyExists);
  CHECK((*store)->insertJob(sampleJob("a", ""), {}).code() == StatusCode::kAlreadyExists);
  CHECK((*store)->loadJobs()->size() == 1);
  CHECK((*store)->loadEvents("b")->empty());
  CHECK((*store)->updateJob(sampleJob("zzz", ""), {}).code() == StatusCode::kNotFound);
}

TEST_CASE("the database runs in WAL mode", "[planner]") {
  loom::testing::TempDir dir;
  auto store = StateStore::open(dir.path() + "/planner.db");
  REQUIRE(store.isOk());
  REQUIRE((*store)->insertJob(sampleJob("a", ""), {}).isOk());
  CHECK(loom::testing::fileExists(dir.path() + "/planner.db-wal"));
}

TEST_CASE("an unusable database path is a clear error", "[planner]") {
  auto store = StateStore::open("/proc/no/such/dir/planner.db");
  REQUIRE_FALSE(store.isOk());
  CHECK(store.status().message().find("/proc/no/such/dir/planner.db") != std::string::npos);
}
