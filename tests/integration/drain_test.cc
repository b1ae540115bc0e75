// Draining nodes: `loomctl drain` (the DrainNode call) and a loomd that drains itself on SIGTERM.
// Their jobs are preempted and relaunched without using a restart; a cordoned node takes no ranks.
#include <csignal>

#include "tests/catch.h"
#include "tests/integration/cluster.h"

using namespace loom;
using namespace loom::testing;

namespace {

std::optional<v1::Node> nodeNamed(client::LoomClient& client, const std::string& id) {
  auto nodes = client.listNodes();
  if (!nodes.isOk()) return std::nullopt;
  for (const auto& n : *nodes)
    if (n.node_id() == id) return n;
  return std::nullopt;
}

bool attached(client::LoomClient& client, const std::vector<std::string>& ids) {
  for (const auto& id : ids) {
    auto node = nodeNamed(client, id);
    if (!node || !node->connected()) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("drain: the node's job relaunches on another without using a restart - nothing lands there until "
          "uncordoned", "[integration]") {
  PlannerProcess planner;
  DaemonProcess a(planner.address, 2, "node-a");
  DaemonProcess b(planner.address, 2, "node-b");
  client::LoomClient client(planner.address, testCredentials().admin);
  REQUIRE(eventually([&] { return attached(client, {"node-a", "node-b"}); }, std::chrono::seconds(20)));

  auto created = client.createJob(probeSpec(2, 60, 50));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(client, created->job().id());
  const std::string drained = running.ranks(0).node_id();
  const std::string other = drained == "node-a" ? "node-b" : "node-a";

  auto node = client.drainNode(drained, "kernel upgrade");
  REQUIRE(node.isOk());
  CHECK(node->cordoned());
  CHECK(node->cordon_reason() == "drained: kernel upgrade");
  v1::Job job = awaitFinal(client, created->job().id());
  INFO(job.reason());
  CHECK(job.state() == v1::SUCCEEDED);
  CHECK(job.attempt() == 2);
  CHECK(job.restarts() == 0);
  CHECK(job.preemptions() == 1);
  for (const auto& r : job.ranks()) CHECK(r.node_id() == other);

  // Four ranks need both nodes: the job waits, saying which node is cordoned and why.
  auto wide = client.createJob(probeSpec(4, 5, 50));
  REQUIRE(wide.isOk());
  CHECK(eventually(
      [&] {
        auto j = client.getJob(wide->job().id());
        return j.isOk() && j->state() == v1::PENDING &&
               j->reason().find("node " + drained + " is cordoned (drained: kernel upgrade)") != std::string::npos;
      },
      std::chrono::seconds(10)));
  auto uncordoned = client.uncordonNode(drained);
  REQUIRE(uncordoned.isOk());
  CHECK_FALSE(uncordoned->cordoned());
  CHECK(awaitFinal(client, wide->job().id()).state() == v1::SUCCEEDED);

  auto unknown = client.drainNode("node-z", "");
  CHECK(unknown.status().code() == StatusCode::kNotFound);
  CHECK(unknown.status().message().find("node node-z has never attached to this planner") != std::string::npos);
}

TEST_CASE("a cordon outlives a planner restart", "[integration]") {
  auto planner = std::make_unique<PlannerProcess>();
  const std::string address = planner->address, stateDir = planner->stateDir();
  DaemonProcess a(address, 2, "node-a");
  {
    client::LoomClient client(address, testCredentials().admin);
    REQUIRE(eventually([&] { return attached(client, {"node-a"}); }, std::chrono::seconds(20)));
    REQUIRE(client.drainNode("node-a", "").isOk());
  }
  planner->process->kill();
  planner = std::make_unique<PlannerProcess>(address, stateDir);
  client::LoomClient client(address, testCredentials().admin);
  REQUIRE(eventually([&] { return attached(client, {"node-a"}); }, std::chrono::seconds(20)));
  auto node = nodeNamed(client, "node-a");
  REQUIRE(node);
  CHECK(node->cordoned());
  CHECK(node->cordon_reason() == "drained");
  auto created = client.createJob(probeSpec(1, 2, 10));
  REQUIRE(created.isOk());
  CHECK(eventually(
      [&] {
        auto j = client.getJob(created->job().id());
        return j.isOk() && j->reason().find("node node-a is cordoned") != std::string::npos;
      },
      std::chrono::seconds(10)));
  REQUIRE(client.uncordonNode("node-a").isOk());
  CHECK(awaitFinal(client, created->job().id()).state() == v1::SUCCEEDED);
}

TEST_CASE("loomd --drain-on-sigterm preempts its ranks before it stops - its next daemon takes them again",
          "[integration]") {
  PlannerProcess planner;
  auto a = std::make_unique<DaemonProcess>(planner.address, 2, "node-a", "",
                                           std::vector<std::string>{"--drain-on-sigterm", "--drain-timeout", "20"});
  const std::string stateDir = a->stateDir();
  client::LoomClient client(planner.address, testCredentials().admin);
  REQUIRE(eventually([&] { return attached(client, {"node-a"}); }, std::chrono::seconds(20)));
  auto created = client.createJob(probeSpec(2, 60, 50));
  REQUIRE(created.isOk());
  const std::string id = created->job().id();
  awaitRunning(client, id);

  // As Kubernetes ends the pod: SIGTERM to loomd, which waits for its ranks before it exits.
  const int status = a->process->terminate();
  CHECK(WIFEXITED(status));
  CHECK(jobProcesses(id).empty());
  CHECK(eventually(
      [&] {
        auto j = client.getJob(id);
        return j.isOk() && j->state() == v1::PENDING && j->preemptions() == 1 &&
               j->reason().find("node node-a is cordoned (stopping: its loomd got SIGTERM)") != std::string::npos;
      },
      std::chrono::seconds(10)));

  // A new daemon for the node (a new pod): the cordon its predecessor left is lifted.
  a = std::make_unique<DaemonProcess>(planner.address, 2, "node-a", stateDir);
  v1::Job job = awaitFinal(client, id);
  INFO(job.reason());
  CHECK(job.state() == v1::SUCCEEDED);
  CHECK(job.attempt() == 2);
  CHECK(job.restarts() == 0);
}
