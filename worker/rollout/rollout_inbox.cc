#include "worker/rollout/rollout_inbox.h"

namespace loom::rollout {

RolloutInbox::Handle RolloutInbox::submit(ServedPrompt prompt, std::shared_ptr<RequestSink> sink) {
  std::lock_guard lock(mu_);
  const Handle handle = nextHandle_++;
  pending_.submitted.push_back({.handle = handle, .prompt = std::move(prompt), .sink = std::move(sink)});
  posted_.notify_one();
  return handle;
}

void RolloutInbox::cancel(Handle handle) {
  std::lock_guard lock(mu_);
  pending_.cancelled.push_back(handle);
  posted_.notify_one();
}

void RolloutInbox::updateWeights(WeightsOrder order) {
  std::lock_guard lock(mu_);
  pending_.updates.push_back(std::move(order));
  posted_.notify_one();
}

void RolloutInbox::setPaused(PauseOrder order) {
  std::lock_guard lock(mu_);
  pending_.pauses.push_back(std::move(order));
  posted_.notify_one();
}

RolloutStatusView RolloutInbox::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

RolloutInbox::Commands RolloutInbox::take(std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  posted_.wait_for(lock, wait, [&] { return !pending_.empty(); });
  Commands out = std::move(pending_);
  pending_ = Commands{};
  return out;
}

void RolloutInbox::publish(const RolloutStatusView& status) {
  std::lock_guard lock(mu_);
  status_ = status;
}

}  // namespace loom::rollout
