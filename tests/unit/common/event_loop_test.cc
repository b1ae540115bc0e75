#include "common/event_loop.h"

#include <atomic>
#include <future>
#include <string>
#include <vector>

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

TEST_CASE("afterTurn runs once after the tasks queued together - and after a timer", "[common]") {
  std::vector<std::string> log;  // written on the loop thread; read once it is joined
  std::promise<void> started, gate, fired;
  std::future<void> open = gate.get_future();
  EventLoop loop("test", [&] { log.push_back("turn"); });
  // The first task holds its turn while three more queue behind it: they make the next turn.
  loop.post([&] {
    started.set_value();
    open.wait();
    log.push_back("a");
  });
  started.get_future().wait();
  for (const char* name : {"b", "c", "d"}) loop.post([&log, name] { log.push_back(name); });
  gate.set_value();
  // Queued tasks go before due timers: the timer's turn is the third whatever the timing.
  loop.runAfter(std::chrono::milliseconds(1), [&] {
    log.push_back("timer");
    fired.set_value();
  });
  fired.get_future().wait();
  loop.stop();
  CHECK(log == std::vector<std::string>{"a", "turn", "b", "c", "d", "turn", "timer", "turn"});
}
