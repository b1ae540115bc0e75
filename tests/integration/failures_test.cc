// Rank failures: the attempt fails, every rank is stopped, and the restart policy decides.
#include <csignal>

#include "tests/catch.h"
#include "tests/integration/cluster.h"

using namespace loom;
using namespace loom::testing;

TEST_CASE("kill -9 of a rank with max_restarts 1: one restart - then SUCCEEDED", "[integration]") {
  Standalone cluster(4);
  auto created = cluster.client->createJob(probeSpec(4, 20, 50, {{"restart", {{"max_restarts", 1}}}}));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(*cluster.client, created->job().id());
  REQUIRE(::kill(running.ranks(2).pid(), SIGKILL) == 0);

  v1::Job job = awaitFinal(*cluster.client, created->job().id());
  INFO(job.reason());
  CHECK(job.state() == v1::SUCCEEDED);
  CHECK(job.restarts() == 1);
  CHECK(job.attempt() == 2);
  CHECK(jobProcesses(job.id()).empty());
}

TEST_CASE("kill -9 of a rank with max_restarts 0: FAILED - naming the rank and its signal", "[integration]") {
  Standalone cluster(4);
  auto created = cluster.client->createJob(probeSpec(4, 100, 50));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(*cluster.client, created->job().id());
  REQUIRE(::kill(running.ranks(1).pid(), SIGKILL) == 0);

  v1::Job job = awaitFinal(*cluster.client, created->job().id());
  INFO(job.reason());
  CHECK(job.state() == v1::FAILED);
  CHECK(job.reason().find("rank 1 ") != std::string::npos);
  CHECK(job.reason().find("killed by SIGKILL") != std::string::npos);
  CHECK(job.reason().find("no restarts allowed") != std::string::npos);
  CHECK(job.ranks(1).signal() == SIGKILL);
  // The other ranks are stopped too (SIGINT, SIGKILL after the grace period).
  CHECK(eventually([&] { return jobProcesses(job.id()).empty(); }, std::chrono::seconds(10)));
}

TEST_CASE("a rank that dies of SIGTERM is preempted: relaunched without using a restart", "[integration]") {
  Standalone cluster(2);
  auto created = cluster.client->createJob(probeSpec(2, 40, 50));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(*cluster.client, created->job().id());
  // SIGTERM to the worker alone: a probe has nothing to save and dies of it; a preemption all the same.
  REQUIRE(::kill(running.ranks(0).pid(), SIGTERM) == 0);
  v1::Job job = awaitFinal(*cluster.client, created->job().id());
  INFO(job.reason());
  CHECK(job.state() == v1::SUCCEEDED);
  CHECK(job.attempt() == 2);
  CHECK(job.restarts() == 0);
  CHECK(job.preemptions() == 1);
}

TEST_CASE("restart.on_preemption false: a rank that dies of SIGTERM fails the job - naming the signal",
          "[integration]") {
  Standalone cluster(2);
  auto created = cluster.client->createJob(probeSpec(2, 100, 50, {{"restart", {{"on_preemption", false}}}}));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(*cluster.client, created->job().id());
  REQUIRE(::kill(running.ranks(0).pid(), SIGTERM) == 0);
  v1::Job job = awaitFinal(*cluster.client, created->job().id());
  INFO(job.reason());
  CHECK(job.state() == v1::FAILED);
  CHECK(job.reason().find("attempt 1 preempted (restart.on_preemption is false): rank 0 ") != std::string::npos);
  CHECK(job.reason().find("killed by SIGTERM") != std::string::npos);
}

TEST_CASE("cancel: CANCELLED and no rank process left", "[integration]") {
  Standalone cluster(4);
  auto created = cluster.client->createJob(probeSpec(4, 1000, 50));
  REQUIRE(created.isOk());
  const std::string id = created->job().id();
  awaitRunning(*cluster.client, id);
  REQUIRE(jobProcesses(id).size() == 4);

  auto cancelled = cluster.client->cancelJob(id, "test");
  REQUIRE(cancelled.isOk());
  CHECK((cancelled->state() == v1::CANCELLING || cancelled->state() == v1::CANCELLED));
  v1::Job job = awaitFinal(*cluster.client, id);
  CHECK(job.state() == v1::CANCELLED);
  CHECK(job.reason().find("cancelled: test") != std::string::npos);
  // CANCELLED is reported only after every rank has been reaped.
  CHECK(jobProcesses(id).empty());

  auto again = cluster.client->cancelJob(id);
  CHECK(again.status().code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("a stopped rank (SIGSTOP) misses its heartbeats and fails the attempt", "[integration]") {
  Standalone cluster(2);
  auto created = cluster.client->createJob(
      probeSpec(2, 1000, 50, {{"timeouts", {{"heartbeat_timeout_s", 1}, {"grace_period_s", 1}}}}));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(*cluster.client, created->job().id());
  auto stoppedAt = std::chrono::system_clock::now();
  REQUIRE(::kill(running.ranks(1).pid(), SIGSTOP) == 0);

  v1::Job job;
  int64_t failedAtMs = 0;
  REQUIRE(cluster.client
              ->watchJob(created->job().id(),
                         [&](const v1::JobUpdate& update) {
                           job = update.job();
                           for (const auto& e : update.events()) {
                             if (e.state() == v1::FAILED) failedAtMs = e.time_ms();
                           }
                           return true;
                         },
                         std::chrono::seconds(30))
              .isOk());
  INFO(job.reason());
  CHECK(job.state() == v1::FAILED);
  CHECK(job.reason().find("rank 1 ") != std::string::npos);
  CHECK(job.reason().find("no heartbeat") != std::string::npos);
  // Detected within the timeout plus the daemon's check interval and the report's way up.
  auto detectedAfterMs =
      failedAtMs - std::chrono::duration_cast<std::chrono::milliseconds>(stoppedAt.time_since_epoch()).count();
  CHECK(detectedAfterMs < 1000 + 1500);
  CHECK(eventually([&] { return jobProcesses(job.id()).empty(); }, std::chrono::seconds(10)));
}
