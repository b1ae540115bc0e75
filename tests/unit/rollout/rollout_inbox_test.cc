#include "worker/rollout/rollout_inbox.h"

#include <thread>

#include "tests/catch.h"

using namespace loom;
using namespace loom::rollout;

namespace {

struct NullSink final : RequestSink {
  void accepted(const std::vector<int64_t>&, int64_t) override {}
  void token(int, const DrawnToken&, std::string_view) override {}
  void finished(int, FinishReason, std::string_view) override {}
  void done() override {}
  void failed(const Status&) override {}
};

}  // namespace

TEST_CASE("rollout inbox: the loop takes what the service posted, in order, and waits when there is nothing",
          "[rollout]") {
  RolloutInbox inbox;
  const auto first = inbox.submit(ServedPrompt{.isText = false, .text = "", .tokenIds = {1, 2}, .sampling = {}},
                                  std::make_shared<NullSink>());
  const auto second = inbox.submit(ServedPrompt{}, std::make_shared<NullSink>());
  CHECK(second == first + 1);
  inbox.cancel(first);
  bool replied = false;
  inbox.setPaused({.pause = true, .reply = [&](const StatusOr<RolloutStatusView>&) { replied = true; }});
  inbox.updateWeights({.dir = "/ckpt", .abortInFlight = true, .version = 3, .reply = {}});

  RolloutInbox::Commands c = inbox.take(std::chrono::milliseconds(0));
  REQUIRE(c.submitted.size() == 2);
  CHECK(c.submitted[0].handle == first);
  CHECK(c.submitted[0].prompt.tokenIds == std::vector<int64_t>{1, 2});
  CHECK(c.cancelled == std::vector<RolloutInbox::Handle>{first});
  REQUIRE(c.pauses.size() == 1);
  c.pauses[0].reply(RolloutStatusView{});
  CHECK(replied);
  REQUIRE(c.updates.size() == 1);
  CHECK(c.updates[0].dir == "/ckpt");
  CHECK(c.updates[0].version == 3);
  CHECK(inbox.take(std::chrono::milliseconds(0)).empty());

  // A post from another thread wakes a waiting loop.
  std::thread poster([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inbox.cancel(7);
  });
  const auto start = std::chrono::steady_clock::now();
  c = inbox.take(std::chrono::seconds(10));
  CHECK(c.cancelled == std::vector<RolloutInbox::Handle>{7});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  poster.join();

  inbox.publish(RolloutStatusView{.weightsVersion = 4, .weightsSource = "/w", .paused = true, .requestsRunning = 0,
                                  .requestsWaiting = 0, .kvBlocksUsed = 0, .kvBlocksTotal = 0, .preemptions = 0,
                                  .requestsServed = 0, .outputTokens = 0, .updatesPending = 0});
  CHECK(inbox.status().weightsVersion == 4);
  CHECK(inbox.status().paused);
}
