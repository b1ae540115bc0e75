#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/loom_kernel_abi.h"

namespace loom::kernels::cpu {

// The plugin's own threads, for hosts that do not pass a parallel_for: threads() - 1 workers
// that sleep between calls, plus the calling thread. parallelFor is thread-safe: calls from
// several threads take turns, and a call made from inside a range runs inline.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(ctx, begin, end) over [0, n) in at most threads() contiguous ranges whose bounds are
  // multiples of `grain` (except n); returns when every range is done.
  void parallelFor(int64_t n, int64_t grain, loom_range_fn fn, void* ctx);

 private:
  void workerLoop(int index);
  void runChunk(int index);

  std::mutex callMutex_;  // one parallelFor at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  // The call in progress.
  loom_range_fn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, grain_ = 1, units_ = 0;
  int chunks_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace loom::kernels::cpu
