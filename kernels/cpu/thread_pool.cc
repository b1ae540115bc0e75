#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace loom::kernels::cpu {

namespace {
thread_local bool tInsideRange = false;
}

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::runChunk(int index) {
  // Ranges in units of grain: chunk i covers units [units * i / chunks, units * (i + 1) / chunks).
  const int64_t begin = std::min(n_, units_ * index / chunks_ * grain_);
  const int64_t end = std::min(n_, units_ * (index + 1) / chunks_ * grain_);
  if (begin < end) {
    tInsideRange = true;
    fn_(ctx_, begin, end);
    tInsideRange = false;
  }
}

void ThreadPool::parallelFor(int64_t n, int64_t grain, loom_range_fn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  const int chunks = static_cast<int>(std::min<int64_t>(threads(), units));
  if (chunks <= 1 || tInsideRange) {
    fn(ctx, 0, n);
    return;
  }
  std::lock_guard<std::mutex> call(callMutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    grain_ = grain;
    units_ = units;
    chunks_ = chunks;
    pending_ = chunks - 1;
    ++generation_;
  }
  wake_.notify_all();
  runChunk(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
}

void ThreadPool::workerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= chunks_) continue;  // fewer chunks than threads this time
    }
    runChunk(index);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace loom::kernels::cpu
