#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {

// One thread that owns a component's state: other threads post() work to it instead of taking
// the component's locks. Tasks run in the order they were posted; a timer runs after its delay,
// on the same thread. post() and runAfter() are thread-safe; everything else is for the owner.
//
// The loop works in turns: a turn runs every task queued when it began (or one timer), then
// `afterTurn` if there is one. An owner that defers work within a turn (the planner commits a
// turn's writes together) does it there.
class EventLoop {
 public:
  using Task = std::function<void()>;

  explicit EventLoop(std::string name, Task afterTurn = {});
  ~EventLoop();  // stops and joins
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // False (and the task dropped) once the loop is stopping.
  bool post(Task task);
  // Runs `task` on the loop after `delay`, unless the loop stops first.
  void runAfter(std::chrono::milliseconds delay, Task task);
  // Runs `task` every `period` until the loop stops.
  void runEvery(std::chrono::milliseconds period, Task task);
  // Posts `task` and waits until it has run; returns at once if the loop has stopped. Never call
  // from the loop thread.
  void runSync(const Task& task);
  bool inLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Lets queued tasks finish, then joins. Idempotent.
  void stop();

 private:
  void run();

  std::string name_;
  Task afterTurn_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Task> queue_;
  std::multimap<std::chrono::steady_clock::time_point, Task> timers_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom
