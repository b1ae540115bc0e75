#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace loom {

// Time comes from a Clock so that state machines and timeouts are tested without sleeping.
// Implementations are thread-safe: the planner reads its clock on gRPC threads as well as on its
// loop (a node's heartbeat is stamped where it arrives).
class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch: stored in events and shown to people.
  virtual int64_t nowMs() const = 0;
  // Monotonic milliseconds: for timeouts.
  virtual int64_t steadyMs() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t nowMs() const override {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
  }
  int64_t steadyMs() const override {
    using namespace std::chrono;
    return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
  }
};

// A clock that moves only when a test says so. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t startMs = 1'700'000'000'000) : now_(startMs) {}
  int64_t nowMs() const override {
    std::lock_guard lock(mu_);
    return now_;
  }
  int64_t steadyMs() const override { return nowMs(); }
  void advanceMs(int64_t ms) {
    std::lock_guard lock(mu_);
    now_ += ms;
  }

 private:
  mutable std::mutex mu_;
  int64_t now_;
};

}  // namespace loom
