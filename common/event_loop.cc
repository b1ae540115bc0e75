#include "common/event_loop.h"

#include <future>
#include <memory>

#include <pthread.h>

namespace loom {

EventLoop::EventLoop(std::string name, Task afterTurn) : name_(std::move(name)), afterTurn_(std::move(afterTurn)) {
  thread_ = std::thread([this] { run(); });
}

EventLoop::~EventLoop() { stop(); }

bool EventLoop::post(Task task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void EventLoop::runAfter(std::chrono::milliseconds delay, Task task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    timers_.emplace(std::chrono::steady_clock::now() + delay, std::move(task));
  }
  cv_.notify_one();
}

void EventLoop::runEvery(std::chrono::milliseconds period, Task task) {
  runAfter(period, [this, period, task = std::move(task)]() mutable {
    task();
    runEvery(period, std::move(task));
  });
}

void EventLoop::runSync(const Task& task) {
  std::promise<void> done;
  bool posted = post([&] {
    task();
    done.set_value();
  });
  if (posted) done.get_future().wait();
}

void EventLoop::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable() && !inLoopThread()) thread_.join();
}

void EventLoop::run() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  std::unique_lock lock(mu_);
  for (;;) {
    if (!queue_.empty()) {
      std::vector<Task> batch;
      batch.swap(queue_);
      lock.unlock();
      for (auto& task : batch) task();
      if (afterTurn_) afterTurn_();
      lock.lock();
      continue;
    }
    if (stopping_) break;
    auto now = std::chrono::steady_clock::now();
    if (!timers_.empty() && timers_.begin()->first <= now) {
      Task task = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
      lock.unlock();
      task();
      if (afterTurn_) afterTurn_();
      lock.lock();
      continue;
    }
    if (timers_.empty()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, timers_.begin()->first);
    }
  }
}

}  // namespace loom
