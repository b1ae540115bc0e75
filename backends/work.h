#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include "common/status.h"

namespace loom::backends {

// The handle of one asynchronous operation. An operation that fails (a peer gone, the watchdog's
// timeout) stores its error here; wait() returns it. Thread-safe.
class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}
  virtual ~Work() = default;

  bool isCompleted() const;
  // OK when done; the operation's error when it failed. Without a timeout it waits for the end,
  // which the backend's watchdog guarantees; with one, DeadlineExceeded (naming the operation)
  // when it passes first, while the operation itself goes on.
  // A backend may find the end itself while waiting (NCCL asks CUDA) rather than wait for its
  // watchdog to notice.
  virtual Status wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  Status error() const;
  // "allReduce #12 on world (4 ranks), 64.0 MiB float32"
  const std::string& description() const { return description_; }

  // For the backend: the operation ended.
  void complete(Status status);

 protected:
  // What wait() returns when `waited` passed before the end.
  Status notCompleteAfter(std::chrono::milliseconds waited) const;

 private:
  std::string description_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Status> result_;
};

}  // namespace loom::backends
