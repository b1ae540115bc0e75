#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::backends {

// A key-value store shared by the ranks of one attempt, for exchanging what they need to
// connect (UCX worker addresses, NCCL unique ids). Keys are written once. Thread-safe.
class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  // Waits until every key exists; DeadlineExceeded names the keys still missing.
  virtual StatusOr<std::vector<std::string>> get(const std::vector<std::string>& keys,
                                                 std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer at `key` (0 if absent) and returns the new value.
  virtual StatusOr<int64_t> add(const std::string& key, int64_t delta) = 0;
};

}  // namespace loom::backends
