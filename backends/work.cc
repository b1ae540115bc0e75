#include "backends/work.h"

namespace loom::backends {

bool Work::isCompleted() const {
  std::lock_guard lock(mu_);
  return result_.has_value();
}

Status Work::wait(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock lock(mu_);
  auto done = [&] { return result_.has_value(); };
  if (!timeout) {
    cv_.wait(lock, done);
  } else if (!cv_.wait_for(lock, *timeout, done)) {
    return notCompleteAfter(*timeout);
  }
  return *result_;
}

Status Work::notCompleteAfter(std::chrono::milliseconds waited) const {
  return Status(StatusCode::kDeadlineExceeded,
                description_ + ": not complete after " + std::to_string(waited.count()) + " ms of waiting (still running)");
}

Status Work::error() const {
  std::lock_guard lock(mu_);
  return result_.value_or(Status::ok());
}

void Work::complete(Status status) {
  {
    std::lock_guard lock(mu_);
    if (result_) return;
    result_ = std::move(status);
  }
  cv_.notify_all();
}

}  // namespace loom::backends
