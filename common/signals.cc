#include "common/signals.h"

#include <pthread.h>

namespace loom {

sigset_t blockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

const char* awaitTerminationSignal(const sigset_t& signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  return sig == SIGINT ? "SIGINT" : "SIGTERM";
}

}  // namespace loom
