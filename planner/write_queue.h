#pragma once

#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include <grpcpp/grpcpp.h>

namespace loom::planner {

// The write side of a gRPC callback stream: messages pushed from any thread are written one at a
// time, in order, and the stream is finished once the queue drains. Reactions are started
// outside the lock (a reaction may run on another thread at once and take it).
//
// `Reactor` is a ServerWriteReactor or ServerBidiReactor whose OnWriteDone calls writeDone() and
// whose OnDone calls detach() before the reactor is deleted.
template <typename Message, typename Reactor>
class WriteQueue {
 public:
  explicit WriteQueue(Reactor* reactor) : reactor_(reactor) {}

  // False once the stream is finishing or gone.
  bool push(Message message) {
    const Message* next = nullptr;
    {
      std::lock_guard lock(mu_);
      if (!reactor_ || finishing_) return false;
      queue_.push_back(std::move(message));
      if (writing_) return true;
      writing_ = true;
      next = &queue_.front();
    }
    reactor_->StartWrite(next);
    return true;
  }

  // As push, but a message that would wait behind another waiting one may be folded into it:
  // `merge(waiting, message)` returns true when it took the message in. A slow reader then gets
  // fewer, larger messages instead of an ever longer queue.
  template <typename Merge>
  bool push(Message message, Merge&& merge) {
    {
      std::lock_guard lock(mu_);
      if (!reactor_ || finishing_) return false;
      // The front is being written; what is behind it is still open.
      if (queue_.size() > 1 && merge(queue_.back(), message)) return true;
    }
    return push(std::move(message));
  }

  // Finishes after the queued messages are written (or at once if none are). Only the first call counts.
  void finish(grpc::Status status) {
    {
      std::lock_guard lock(mu_);
      if (!reactor_ || finishing_) return;
      finishing_ = true;
      finalStatus_ = std::move(status);
      if (writing_) return;  // writeDone() finishes
    }
    reactor_->Finish(*finalStatus_);
  }

  void writeDone(bool ok) {
    const Message* next = nullptr;
    bool finishNow = false;
    {
      std::lock_guard lock(mu_);
      queue_.pop_front();
      if (!ok) {
        // The client went away: nothing more can be written.
        queue_.clear();
        if (!finishing_) {
          finishing_ = true;
          finalStatus_ = grpc::Status::CANCELLED;
        }
      }
      if (queue_.empty()) {
        writing_ = false;
        finishNow = finishing_;
      } else {
        next = &queue_.front();
      }
    }
    if (next) {
      reactor_->StartWrite(next);
    } else if (finishNow) {
      reactor_->Finish(*finalStatus_);
    }
  }

  void detach() {
    std::lock_guard lock(mu_);
    reactor_ = nullptr;
  }

 private:
  std::mutex mu_;
  Reactor* reactor_;
  std::deque<Message> queue_;  // a deque: pushing never moves the message being written
  bool writing_ = false;
  bool finishing_ = false;
  std::optional<grpc::Status> finalStatus_;
};

}  // namespace loom::planner
