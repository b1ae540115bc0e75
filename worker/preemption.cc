#include "worker/preemption.h"

#include <atomic>
#include <csignal>

namespace loom::worker {

namespace {

std::atomic<bool> sigtermSeen{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void onSigterm(int) { sigtermSeen.store(true, std::memory_order_relaxed); }

}  // namespace

void catchPreemption() {
  struct sigaction action {};
  action.sa_handler = onSigterm;
  sigemptyset(&action.sa_mask);
  // Restarted, not failed with EINTR: the rank's sockets and waits go on until the safe point.
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &action, nullptr);
}

bool preemptionRequested() { return sigtermSeen.load(std::memory_order_relaxed); }

}  // namespace loom::worker
