// The planner commits a turn's writes together, and nothing that depends on them leaves before they
// are committed: CreateJob's answer, a launch or release order to a daemon, and what GetJob reads.
// Each is checked against the database file itself, through a connection of its own, at the moment
// it leaves the planner.
#include <atomic>
#include <chrono>
#include <future>

#include <fmt/format.h>
#include <sqlite3.h>

#include "common/clock.h"
#include "planner/node_link.h"
#include "planner/planner_core.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::planner;

namespace {

// The job's row as committed to the file (what a crash would leave): "STATE attempt N", or
// "none" when there is no committed row.
std::string committedRow(const std::string& dbPath, const std::string& jobId) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(dbPath.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, "SELECT state, attempt FROM jobs WHERE id = ?", -1, &st, nullptr) == SQLITE_OK);
  sqlite3_bind_text(st, 1, jobId.c_str(), -1, SQLITE_TRANSIENT);
  std::string row = "none";
  if (sqlite3_step(st) == SQLITE_ROW)
    row = fmt::format("{} attempt {}", jobStateName(static_cast<JobState>(sqlite3_column_int(st, 0))),
                      sqlite3_column_int(st, 1));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return row;
}

std::string row(JobState state, int attempt) { return fmt::format("{} attempt {}", jobStateName(state), attempt); }

// A daemon's stream that notes, as each launch and release order reaches it, what the database
// file held for that job at that moment.
class CheckingLink final : public NodeLink {
 public:
  explicit CheckingLink(std::string dbPath) : dbPath_(std::move(dbPath)) {}
  void launch(const LaunchOrder& order) override { launched.set_value(committedRow(dbPath_, order.jobId)); }
  void kill(const KillOrder&) override {}
  // The attempt's end and each rank's exit may each release it: the first counts.
  void release(const ReleaseOrder& order) override {
    if (!releasedOnce_.exchange(true)) released.set_value(committedRow(dbPath_, order.jobId));
  }
  void requestLogs(const LogQuery&) override {}
  void cancelLogs(int64_t) override {}
  void close(const Status&) override {}

  std::promise<std::string> launched;
  std::promise<std::string> released;

 private:
  std::string dbPath_;
  std::atomic<bool> releasedOnce_{false};
};

template <typename T>
T within(std::future<T> future, const char* what) {
  INFO(what);
  REQUIRE(future.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  return future.get();
}

}  // namespace

TEST_CASE("what leaves the planner is committed first: CreateJob's answer, launch and release orders, GetJob's view",
          "[planner]") {
  testing::TempDir dir;
  const std::string dbPath = dir.path() + "/planner.db";
  ManualClock clock;
  auto core = PlannerCore::create({.stateDir = dir.path()}, &clock);
  REQUIRE(core.isOk());
  auto link = std::make_shared<CheckingLink>(dbPath);
  (*core)->nodeRegistered(link, NodeRegistration{.nodeId = "n1", .hostname = "h1", .address = "10.0.0.1",
                                                 .slots = 2, .ranks = {}, .instanceId = "a"});

  std::promise<std::pair<std::string, std::string>> answered;
  (*core)->createJob(R"({"name": "p", "kind": "probe", "resources": {"ranks": 2}})", "", JobOwner{},
                     [&](const StatusOr<JobRecord>& job, bool created) {
                       REQUIRE(job.isOk());
                       CHECK(created);
                       answered.set_value({job->id, committedRow(dbPath, job->id)});
                     });
  auto [jobId, atAnswer] = within(answered.get_future(), "CreateJob's answer");
  CHECK(atAnswer == row(JobState::kPending, 0));
  CHECK(within(link->launched.get_future(), "the launch order") == row(JobState::kLaunching, 1));

  // Both ranks start and end in one turn of the loop; the release goes out once the end is stored.
  for (int rank : {0, 1}) {
    for (RankEvent event : {RankEvent::kStarted, RankEvent::kReady, RankEvent::kExited}) {
      (*core)->rankReported(link, RankReport{.jobId = jobId, .attempt = 1, .rank = rank, .event = event,
                                             .pid = 100 + rank});
    }
  }
  CHECK(within(link->released.get_future(), "the release order") == row(JobState::kSucceeded, 1));

  // GetJob answers from the views, which show a change once it is committed, never before.
  auto view = (*core)->job(jobId);
  REQUIRE(view.isOk());
  CHECK((*view)->state == JobState::kSucceeded);
  CHECK(committedRow(dbPath, jobId) == row(JobState::kSucceeded, 1));
}
