// State survives a planner restart; a restarted daemon re-adopts its ranks.
#include <csignal>

#include "common/files.h"
#include "common/process.h"

#include "tests/catch.h"
#include "tests/integration/cluster.h"

using namespace loom;
using namespace loom::testing;

TEST_CASE("the planner restarts while a job runs: the job is still there and ends", "[integration]") {
  auto planner = std::make_unique<PlannerProcess>();
  const std::string address = planner->address;
  DaemonProcess node(address, 2, "node-a");
  std::string jobId;
  {
    client::LoomClient client(address, testCredentials().admin);
    auto created = client.createJob(probeSpec(2, 40, 50));  // about 2 s of work
    REQUIRE(created.isOk());
    jobId = created->job().id();
    awaitRunning(client, jobId);
  }
  // Down hard, then back on the same address with the same state directory.
  std::string stateDir = planner->stateDir();
  planner->process->kill();
  auto restarted = std::make_unique<PlannerProcess>(address, stateDir);
  client::LoomClient client(address, testCredentials().admin);
  auto job = client.getJob(jobId);
  REQUIRE(job.isOk());
  v1::Job final = awaitFinal(client, jobId);
  INFO(final.reason());
  CHECK(final.state() == v1::SUCCEEDED);
  CHECK(final.attempt() == 1);  // the ranks ran on: no restart was needed
}

TEST_CASE("a failure while the planner is down is reported when it returns", "[integration]") {
  auto planner = std::make_unique<PlannerProcess>();
  const std::string address = planner->address;
  DaemonProcess node(address, 2, "node-a");
  client::LoomClient client(address, testCredentials().admin);
  auto created = client.createJob(probeSpec(2, 1000, 50));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(client, created->job().id());

  std::string stateDir = planner->stateDir();
  planner->process->kill();
  REQUIRE(::kill(running.ranks(0).pid(), SIGKILL) == 0);
  auto restarted = std::make_unique<PlannerProcess>(address, stateDir);
  v1::Job final = awaitFinal(client, created->job().id());
  INFO(final.reason());
  CHECK(final.state() == v1::FAILED);
  CHECK(final.reason().find("rank 0 ") != std::string::npos);
  CHECK(final.reason().find("SIGKILL") != std::string::npos);
}

TEST_CASE("loomd restarts while its ranks run: it re-adopts them and the job succeeds", "[integration]") {
  PlannerProcess planner;
  auto node = std::make_unique<DaemonProcess>(planner.address, 2, "node-a");
  client::LoomClient client(planner.address, testCredentials().admin);
  auto created = client.createJob(probeSpec(2, 40, 50));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(client, created->job().id());

  std::string stateDir = node->stateDir();
  node->process->kill();  // the ranks keep running without their daemon
  auto again = std::make_unique<DaemonProcess>(planner.address, 2, "node-a", stateDir);
  v1::Job final = awaitFinal(client, created->job().id());
  INFO(final.reason());
  CHECK(final.state() == v1::SUCCEEDED);
  CHECK(final.attempt() == 1);
  CHECK(final.ranks(0).pid() == running.ranks(0).pid());
}

TEST_CASE("a node that never comes back fails its ranks after the node timeout", "[integration]") {
  PlannerProcess planner("127.0.0.1:0", "", /*nodeTimeoutS=*/2);
  auto node = std::make_unique<DaemonProcess>(planner.address, 2, "node-a");
  client::LoomClient client(planner.address, testCredentials().admin);
  auto created = client.createJob(probeSpec(2, 1000, 50));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(client, created->job().id());
  node->process->kill();
  v1::Job final = awaitFinal(client, created->job().id());
  INFO(final.reason());
  CHECK(final.state() == v1::FAILED);
  CHECK(final.reason().find("node node-a lost contact") != std::string::npos);
  // The orphaned ranks are not ours to reap any more: stop them by hand.
  for (const auto& r : running.ranks()) ::kill(r.pid(), SIGKILL);
}

TEST_CASE("ranks that end while loomd is down are reported by the restarted loomd", "[integration]") {
  PlannerProcess planner;
  auto node = std::make_unique<DaemonProcess>(planner.address, 2, "node-a");
  client::LoomClient client(planner.address, testCredentials().admin);
  auto created = client.createJob(probeSpec(2, 10, 50));  // about half a second of work
  REQUIRE(created.isOk());
  awaitRunning(client, created->job().id());
  std::string stateDir = node->stateDir();
  node->process->kill();
  REQUIRE(eventually([&] { return jobProcesses(created->job().id()).empty(); }, std::chrono::seconds(20)));
  auto again = std::make_unique<DaemonProcess>(planner.address, 2, "node-a", stateDir);
  v1::Job final = awaitFinal(client, created->job().id());
  INFO(final.reason());
  CHECK(final.state() == v1::SUCCEEDED);  // from the exit codes the ranks left behind
}

TEST_CASE("ranks that end while the planner is down are reported when it returns", "[integration]") {
  auto planner = std::make_unique<PlannerProcess>();
  const std::string address = planner->address;
  DaemonProcess node(address, 2, "node-a");
  std::string jobId;
  {
    client::LoomClient client(address, testCredentials().admin);
    auto created = client.createJob(probeSpec(2, 10, 50));
    REQUIRE(created.isOk());
    jobId = created->job().id();
    awaitRunning(client, jobId);
  }
  std::string stateDir = planner->stateDir();
  planner->process->kill();
  REQUIRE(eventually([&] { return jobProcesses(jobId).empty(); }, std::chrono::seconds(20)));
  auto restarted = std::make_unique<PlannerProcess>(address, stateDir);
  client::LoomClient client(address, testCredentials().admin);
  v1::Job final = awaitFinal(client, jobId);
  INFO(final.reason());
  CHECK(final.state() == v1::SUCCEEDED);
}

TEST_CASE("a second planner on the same state directory is refused", "[integration]") {
  PlannerProcess first;
  TempDir logs;
  Child second(binary("loom-planner"), {"--listen", "127.0.0.1:0", "--state-dir", first.stateDir()},
               logs.path() + "/second.log");
  REQUIRE(eventually([&] { return !process::isAlive(second.pid()); }, std::chrono::seconds(10)));
  CHECK(files::readFile(logs.path() + "/second.log").value().find("another loom-planner is using the state directory") !=
        std::string::npos);
}
