#include "planner/state_store.h"

#include <sqlite3.h>

#include "planner/plan_compiler.h"
#include "proto/convert.h"
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
                          .signal = 0, .detail = "", .step = 3, .serviceAddress = "127.0.0.1:4321"},
               RankStatus{.rank = 1, .nodeId = "n", .pid = 8, .state = RankState::kFailed, .exitCode = 0,
                          .signal = 15, .detail = "killed by SIGTERM", .step = 2, .serviceAddress = ""}};
  job.preemptions = 2;
  job.preemptedAttempt = 1;
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
    REQUIRE((*store)->updateJob(job, {}, {Metric{.attempt = 1, .rank = 0, .step = 1, .name = "m", .value = 0.5,
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
  CHECK(job.ranks[1].signal == 15);
  CHECK(job.ranks[1].detail == "killed by SIGTERM");
  CHECK(job.ranks[0].serviceAddress == "127.0.0.1:4321");
  CHECK_FALSE(job.ranks[0].preempted());
  CHECK(job.ranks[1].preempted());  // SIGTERM from outside
  CHECK(job.preemptions == 2);
  CHECK(job.preemptedAttempt == 1);
  CHECK(job.metrics.at("probe.tick") == 3);
  CHECK(job.spec.ranks == 2);
  auto events = (*store)->loadEvents("a");
  REQUIRE(events->size() == 2);
  CHECK((*events)[1].reason == "done");
  auto metrics = (*store)->loadMetrics("a", 10);
  REQUIRE(metrics->size() == 1);
  CHECK((*metrics)[0].value == 0.5);
}

TEST_CASE("a database of an earlier planner gains the columns added since, its jobs kept", "[planner]") {
  loom::testing::TempDir dir;
  const std::string path = dir.path() + "/planner.db";
  {
    auto store = StateStore::open(path);
    REQUIRE(store.isOk());
    REQUIRE((*store)->insertJob(sampleJob("old", ""), {}).isOk());
  }
  // An earlier planner's jobs table: without the columns migrate() adds.
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  for (const char* column : {"plan", "preemptions", "preempted_attempt"}) {
    const std::string drop = std::string("ALTER TABLE jobs DROP COLUMN ") + column;
    REQUIRE(sqlite3_exec(db, drop.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  }
  sqlite3_close(db);
  auto store = StateStore::open(path);
  REQUIRE(store.isOk());
  auto jobs = (*store)->loadJobs();
  REQUIRE(jobs.isOk());
  REQUIRE(jobs->size() == 1);
  CHECK((*jobs)[0].id == "old");
  CHECK((*jobs)[0].preemptions == 0);
  CHECK_FALSE((*jobs)[0].hasPlan);
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

TEST_CASE("a job's plan is stored with it - read back whole - NOT_FOUND when it has none", "[planner]") {
  loom::testing::TempDir dir;
  const std::string path = dir.path() + "/planner.db";
  auto model = *parseModelConfig(R"({"model_type": "mixtral", "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2})");
  auto spec = parseJobSpec(R"({"name": "t", "kind": "train", "resources": {"ranks": 8},
    "model": {"config": "/m/config.json"}, "data": {"train": "/d.tokens", "seq_len": 64}, "train": {"steps": 1},
    "deepspeed": {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"},
      "zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 2},
      "expert_parallel": {"enabled": true, "autoep_size": 4}}})",
                           SpecPurpose::kPlan);
  REQUIRE(spec.isOk());
  auto plan = compilePlan(model, *spec);
  REQUIRE(plan.isOk());
  const std::string expected = convert::toProto(*plan).SerializeAsString();
  {
    auto store = StateStore::open(path);
    REQUIRE(store.isOk());
    JobRecord job = sampleJob("planned", "");
    job.hasPlan = true;
    REQUIRE((*store)->insertJob(job, {}, &*plan).isOk());
    REQUIRE((*store)->insertJob(sampleJob("probe", ""), {}).isOk());
  }
  auto store = StateStore::open(path);
  REQUIRE(store.isOk());
  auto jobs = (*store)->loadJobs();
  REQUIRE(jobs.isOk());
  CHECK(((*jobs)[0].hasPlan && !(*jobs)[1].hasPlan));
  auto loaded = (*store)->loadPlan("planned");
  REQUIRE(loaded.isOk());
  // Every field survives the trip through loom.v1.Plan and back.
  CHECK(convert::toProto(*loaded).SerializeAsString() == expected);
  CHECK(loaded->zero.buffers.size() == plan->zero.buffers.size());
  CHECK(loaded->parameters.back().localShape == plan->parameters.back().localShape);
  CHECK((loaded->routing && loaded->routing->topK == 2));
  CHECK((*store)->loadPlan("probe").status().message() ==
        "job probe has no plan (only train, eval and rollout jobs are compiled)");
  CHECK((*store)->loadPlan("nope").status().code() == StatusCode::kNotFound);
}

TEST_CASE("a database of the first schema gains the plan column when opened", "[planner]") {
  loom::testing::TempDir dir;
  const std::string path = dir.path() + "/planner.db";
  {
    // The jobs table as the first planner wrote it, with one job.
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    const std::string specJson = sampleJob("old", "").specJson;
    const std::string sql =
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, request_id TEXT UNIQUE, "
        "spec_json TEXT NOT NULL, state INTEGER NOT NULL, reason TEXT NOT NULL, attempt INTEGER NOT NULL, "
        "restarts INTEGER NOT NULL, create_time_ms INTEGER NOT NULL, update_time_ms INTEGER NOT NULL, "
        "ranks_json TEXT NOT NULL, metrics_json TEXT NOT NULL, last_event_seq INTEGER NOT NULL);"
        "INSERT INTO jobs (id, spec_json, state, reason, attempt, restarts, create_time_ms, update_time_ms, "
        "ranks_json, metrics_json, last_event_seq) VALUES ('old', '" +
        specJson + "', 5, 'done', 1, 0, 1, 2, '[]', '{}', 1);";
    REQUIRE(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
  }
  for (int reopen = 0; reopen < 2; ++reopen) {  // migrating twice is harmless
    auto store = StateStore::open(path);
    INFO(store.status().toString());
    REQUIRE(store.isOk());
    auto jobs = (*store)->loadJobs();
    REQUIRE(jobs.isOk());
    REQUIRE(jobs->size() == 1);
    CHECK_FALSE((*jobs)[0].hasPlan);
    CHECK((*store)->loadPlan("old").status().code() == StatusCode::kNotFound);
  }
}

TEST_CASE("metric pages - every row in order, filtered by name and rank, resumed after a page's last row",
          "[planner]") {
  loom::testing::TempDir dir;
  auto store = StateStore::open(dir.path() + "/planner.db");
  REQUIRE(store.isOk());
  const JobRecord job = sampleJob("a", "ra");
  REQUIRE((*store)->insertJob(job, {}).isOk());
  std::vector<Metric> rows;
  for (int step = 1; step <= 300; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      rows.push_back({.attempt = 1, .rank = rank, .step = step, .name = "loss", .value = step + rank / 10.0});
      rows.push_back({.attempt = 1, .rank = rank, .step = step, .name = "lr", .value = 1e-3});
    }
  }
  REQUIRE((*store)->updateJob(job, {}, rows).isOk());

  auto all = (*store)->loadMetricPage({.jobId = "a"});
  REQUIRE(all.isOk());
  CHECK(all->metrics.size() == 1200);  // beyond WatchJob's backlog of 200
  CHECK_FALSE(all->more);

  // Rank 0's losses, 128 at a time: 300 rows in 3 pages, in step order.
  std::vector<double> steps;
  MetricQuery query{.jobId = "a", .names = {"loss"}, .ranks = {0}, .afterRow = 0, .limit = 128};
  int pages = 0;
  for (bool more = true; more; ++pages) {
    auto page = (*store)->loadMetricPage(query);
    REQUIRE(page.isOk());
    for (const auto& m : page->metrics) {
      CHECK(m.name == "loss");
      CHECK(m.rank == 0);
      steps.push_back(static_cast<double>(m.step));
    }
    query.afterRow = page->lastRow;
    more = page->more;
  }
  CHECK(pages == 3);
  REQUIRE(steps.size() == 300);
  CHECK(std::is_sorted(steps.begin(), steps.end()));

  // Polling after the last row: nothing, the same position; then the new row alone.
  auto empty = (*store)->loadMetricPage(query);
  REQUIRE(empty.isOk());
  CHECK(empty->metrics.empty());
  CHECK(empty->lastRow == query.afterRow);
  REQUIRE((*store)->updateJob(job, {}, {{.attempt = 1, .rank = 0, .step = 301, .name = "loss", .value = 9}}).isOk());
  auto next = (*store)->loadMetricPage(query);
  REQUIRE(next.isOk());
  REQUIRE(next->metrics.size() == 1);
  CHECK(next->metrics[0].step == 301);
}

namespace {

// Jobs another connection to the file sees: what is committed, never a group still open.
int committedJobs(const std::string& path) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM jobs", -1, &st, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  int n = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

}  // namespace

TEST_CASE("grouped commits - writes land together at commitGroup, a failed one undoes itself alone", "[planner]") {
  loom::testing::TempDir dir;
  const std::string path = dir.path() + "/planner.db";
  auto store = StateStore::open(path);
  REQUIRE(store.isOk());
  (*store)->groupCommits();
  CHECK_FALSE((*store)->hasUncommitted());

  JobEvent created{.seq = 1, .timeMs = 10, .state = JobState::kPending, .attempt = 0, .reason = "created"};
  REQUIRE((*store)->insertJob(sampleJob("a", "req-a"), {created}).isOk());
  CHECK((*store)->hasUncommitted());
  // The same id again fails inside the group; the job before it and the one after it stay.
  Status taken = (*store)->insertJob(sampleJob("a", "req-other"), {created});
  CHECK(taken.code() == StatusCode::kAlreadyExists);
  REQUIRE((*store)->insertJob(sampleJob("b", ""), {created}).isOk());
  REQUIRE((*store)->putCordon("n1", "drained", 30).isOk());
  // Reads on the store's own connection see the group; another connection does not yet.
  CHECK((*store)->loadJobs()->size() == 2);
  CHECK(committedJobs(path) == 0);

  REQUIRE((*store)->commitGroup().isOk());
  CHECK_FALSE((*store)->hasUncommitted());
  CHECK(committedJobs(path) == 2);
  CHECK((*store)->loadCordons()->count("n1") == 1);
  CHECK((*store)->commitGroup().isOk());  // nothing open: nothing to do

  // A group still open when the store closes is committed.
  JobRecord b = sampleJob("b", "");
  b.state = JobState::kSucceeded;
  REQUIRE((*store)->updateJob(b, {}).isOk());
  store->reset();
  auto reopened = StateStore::open(path);
  REQUIRE(reopened.isOk());
  auto jobs = (*reopened)->loadJobs();
  REQUIRE(jobs->size() == 2);
  CHECK((*jobs)[1].state == JobState::kSucceeded);
}
