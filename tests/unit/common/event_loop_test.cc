#include "common/event_loop.h"

#include <atomic>
#include <future>

#include "tests/catch.h"

using loom::EventLoop;

TEST_CASE("posted tasks run in order on the loop thread", "[common]") {
  EventLoop loop("test");
  std::vector<int> order;
  std::thread::id loopThread;
  for (int i = 0; i < 100; ++i) loop.post([&, i] { order.push_back(i); });
  loop.runSync([&] { loopThread = std::this_thread::get_id(); });
  CHECK(loopThread != std::this_thread::get_id());
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[i] == i);
}

TEST_CASE("timers run after their delay - a stopped loop refuses work", "[common]") {
  EventLoop loop("test");
  std::promise<void> fired;
  loop.runAfter(std::chrono::milliseconds(1), [&] { fired.set_value(); });
  CHECK(fired.get_future().wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  std::atomic<int> ticks{0};
  std::promise<void> three;
  loop.runEvery(std::chrono::milliseconds(1), [&] {
    if (++ticks == 3) three.set_value();
  });
  CHECK(three.get_future().wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  loop.stop();
  CHECK_FALSE(loop.post([] {}));
  loop.runSync([] {});  // returns at once instead of hanging
}
