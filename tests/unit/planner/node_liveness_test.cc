// PlannerCore's view of a node's liveness on a manual clock: heartbeats (stamped where they arrive,
// not on the loop) keep a node attached; silence past the node timeout drops its stream, and the
// node list keeps showing when it was last heard.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "common/clock.h"
#include "planner/node_link.h"
#include "planner/planner_core.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::planner;

namespace {

// A daemon's stream that takes every order and remembers whether the planner closed it.
class QuietLink final : public NodeLink {
 public:
  void launch(const LaunchOrder&) override {}
  void kill(const KillOrder&) override {}
  void release(const ReleaseOrder&) override {}
  void requestLogs(const LogQuery&) override {}
  void cancelLogs(int64_t) override {}
  void close(const Status&) override { closed = true; }
  std::atomic<bool> closed{false};
};

NodeView nodeNamed(PlannerCore& core, const std::string& nodeId) {
  std::promise<std::vector<NodeView>> listed;
  core.listNodes([&](std::vector<NodeView> nodes) { listed.set_value(std::move(nodes)); });
  for (const NodeView& n : listed.get_future().get())
    if (n.nodeId == nodeId) return n;
  FAIL("node " << nodeId << " is not listed");
  return {};
}

// The expiry runs on the loop's timer (every 150 ms here), in real time; the clock it compares
// with is the manual one.
void letExpiryRun() { std::this_thread::sleep_for(std::chrono::milliseconds(400)); }

}  // namespace

TEST_CASE("heartbeats keep a node attached; after the node timeout its stream is dropped, last seen kept",
          "[planner]") {
  testing::TempDir dir;
  ManualClock clock;
  auto core = PlannerCore::create({.stateDir = dir.path(), .nodeTimeoutMs = 1'000, .nodeHeartbeatIntervalMs = 300},
                                  &clock);
  REQUIRE(core.isOk());
  auto link = std::make_shared<QuietLink>();
  const int64_t registeredAt = clock.nowMs();
  (*core)->nodeRegistered(link, NodeRegistration{.nodeId = "n1", .hostname = "h1", .address = "10.0.0.1",
                                                 .slots = 2, .ranks = {}, .instanceId = "a"});
  CHECK(nodeNamed(**core, "n1").lastSeenMs == registeredAt);

  // Heartbeats every 800 ms, each within the 1 s timeout: 2.4 s in all, still attached.
  for (int beat = 1; beat <= 3; ++beat) {
    clock.advanceMs(800);
    (*core)->nodeHeartbeat(link);
    letExpiryRun();
  }
  const int64_t lastBeat = clock.nowMs();
  NodeView alive = nodeNamed(**core, "n1");
  CHECK(alive.connected);
  CHECK(alive.lastSeenMs == lastBeat);
  CHECK_FALSE(link->closed);

  // Silence past the timeout: the stream is dropped, and the list still says when it was heard.
  clock.advanceMs(1'200);
  letExpiryRun();
  NodeView lost = nodeNamed(**core, "n1");
  CHECK_FALSE(lost.connected);
  CHECK(lost.lastSeenMs == lastBeat);
  CHECK(link->closed);

  // A heartbeat on the dropped stream changes nothing.
  clock.advanceMs(100);
  (*core)->nodeHeartbeat(link);
  CHECK(nodeNamed(**core, "n1").lastSeenMs == lastBeat);
  (*core)->shutdown();
}
