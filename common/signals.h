#pragma once

#include <csignal>

namespace loom {

// For a service's main(): SIGINT and SIGTERM are blocked in every thread (call this before any
// thread starts), and awaitTerminationSignal() takes them synchronously, so shutdown runs in
// main() instead of a signal handler.
sigset_t blockTerminationSignals();
// Waits for SIGINT or SIGTERM; returns its name.
const char* awaitTerminationSignal(const sigset_t& signals);

}  // namespace loom
