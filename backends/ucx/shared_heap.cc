#include "backends/ucx/shared_heap.h"

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <new>
#include <random>

#include <fmt/format.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::backends {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHeaderBytes = size_t(2) << 20;  // pid, then the groups' lines
constexpr size_t kAlignment = size_t(2) << 20;     // allocations start on 2 MiB boundaries

static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters shared between processes must be lock-free");

size_t roundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

std::string segmentName(const std::string& token, int rank) { return fmt::format("/loom-heap-{}-{}", token, rank); }

// Segments are as large as the host's memory: more could never be allocated anyway. Every rank
// maps every segment, so ranks x memory must fit the address space (128 TiB on x86-64); where it
// does not, setup fails and collectives go over messages.
size_t hostMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? roundUp(static_cast<size_t>(pages) * static_cast<size_t>(page), kAlignment)
                               : size_t(16) << 30;
}

void cpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Publishes this rank's outcome of a setup step under `key`/<rank> and reads every rank's: OK
// only when all succeeded, else the first failure, naming its rank.
Status agree(Store& store, const std::string& key, int rank, int n, const Status& mine,
             std::chrono::milliseconds timeout) {
  RETURN_IF_ERROR(store.set(fmt::format("{}/{}", key, rank), mine.isOk() ? "ok" : mine.message()));
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(fmt::format("{}/{}", key, r));
  ASSIGN_OR_RETURN(std::vector<std::string> outcomes, store.get(keys, timeout));
  for (int r = 0; r < n; ++r) {
    if (outcomes[r] != "ok") return unavailable("rank {}: {}", r, outcomes[r]);
  }
  return Status::ok();
}

}  // namespace

struct SharedHeap::Header {
  pid_t pid = 0;
  uint64_t startTime = 0;  // the process's, so that a reused pid does not pass for it
};

namespace {

// Field 22 of /proc/<pid>/stat (start time in clock ticks), and whether the process has ended
// (state Z or X: a child not yet reaped still has a pid). 0 when there is no such process.
uint64_t startTimeOf(pid_t pid, bool* ended) {
  *ended = true;
  std::FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
  if (!f) return 0;
  char buffer[1024];
  const size_t n = std::fread(buffer, 1, sizeof buffer - 1, f);
  std::fclose(f);
  buffer[n] = 0;
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const char* p = std::strrchr(buffer, ')');
  if (!p) return 0;
  char state = 0;
  unsigned long long start = 0;
  if (std::sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &state,
                  &start) != 2)
    return 0;
  *ended = state == 'Z' || state == 'X';
  return start;
}

bool processLives(pid_t pid, uint64_t startTime) {
  bool ended = false;
  const uint64_t start = startTimeOf(pid, &ended);
  return !ended && start == startTime;
}

}  // namespace

// One group's lines in one rank's segment.
struct SharedHeap::GroupLines {
  // One round's entry, written like a seqlock: `tag` is the round + 1 (0: never written), and
  // kNoRound while it changes.
  struct alignas(64) Place {
    std::atomic<uint64_t> tag{kNoRound};
    std::atomic<int64_t> offset{-1};
    std::atomic<int64_t> bytes{0};
  };
  static constexpr uint64_t kNoRound = ~uint64_t(0);
  Counter entered, left;
  Place entries[2];  // by round parity
};

StatusOr<std::shared_ptr<SharedHeap>> SharedHeap::create(Store& store, int rank, int n,
                                                         std::chrono::milliseconds timeout) {
  std::string token;
  if (rank == 0) {
    std::random_device entropy;
    token = fmt::format("{:08x}{:08x}-{}", entropy(), entropy(), ::getpid());
    RETURN_IF_ERROR(store.set("ucx/heap/token", token));
  } else {
    ASSIGN_OR_RETURN(std::vector<std::string> value, store.get({"ucx/heap/token"}, timeout));
    token = value[0];
  }
  const size_t bytes = hostMemoryBytes();
  std::vector<char*> segments(n, nullptr);
  auto unmapAll = [&] {
    for (char* s : segments)
      if (s) ::munmap(s, bytes);
  };
  auto map = [&](int fd, const std::string& name) -> StatusOr<char*> {
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (base == MAP_FAILED) return unavailable("mmap of {} ({} GiB): {}", name, bytes >> 30, std::strerror(errno));
    return static_cast<char*>(base);
  };

  // 1. Each rank makes its own segment and reserves its header (a full /dev/shm shows here).
  const std::string own = segmentName(token, rank);
  const int fd = ::shm_open(own.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  Status made = fd < 0 ? unavailable("shm_open {}: {}", own, std::strerror(errno)) : Status::ok();
  if (made.isOk() && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    made = unavailable("ftruncate {} to {} GiB: {}", own, bytes >> 30, std::strerror(errno));
  if (made.isOk() && ::fallocate(fd, 0, 0, kHeaderBytes) != 0)
    made = unavailable("reserving the header of {}: {}", own, std::strerror(errno));
  if (made.isOk()) {
    auto mine = map(fd, own);
    if (mine.isOk()) {
      segments[rank] = *mine;
      bool ended = false;
      new (segments[rank]) Header{::getpid(), startTimeOf(::getpid(), &ended)};
    } else {
      made = mine.status();
    }
  }
  Status all = agree(store, "ucx/heap/made", rank, n, made, timeout);
  if (!all.isOk()) {
    unmapAll();
    if (fd >= 0) {
      ::close(fd);
      ::shm_unlink(own.c_str());
    }
    return all;
  }

  // 2. Each maps the others'; then the names go (the mappings stay).
  Status mapped;
  for (int r = 0; r < n && mapped.isOk(); ++r) {
    if (r == rank) continue;
    const std::string name = segmentName(token, r);
    const int peer = ::shm_open(name.c_str(), O_RDWR, 0);
    if (peer < 0) {
      mapped = unavailable("shm_open {}: {}", name, std::strerror(errno));
      break;
    }
    auto base = map(peer, name);
    ::close(peer);
    if (base.isOk()) {
      segments[r] = *base;
    } else {
      mapped = base.status();
    }
  }
  all = agree(store, "ucx/heap/mapped", rank, n, mapped, timeout);
  ::shm_unlink(own.c_str());
  if (!all.isOk()) {
    unmapAll();
    ::close(fd);
    return all;
  }
  cpu_set_t cpus;
  const int cores = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  return std::shared_ptr<SharedHeap>(new SharedHeap(rank, fd, bytes, std::move(segments), /*oversubscribed=*/n > cores));
}

SharedHeap::SharedHeap(int rank, int fd, size_t segmentBytes, std::vector<char*> segments, bool oversubscribed)
    : rank_(rank), fd_(fd), segmentBytes_(segmentBytes), segments_(std::move(segments)), oversubscribed_(oversubscribed) {
  free_[kHeaderBytes] = segmentBytes_ - kHeaderBytes;
}

SharedHeap::~SharedHeap() {
  for (char* s : segments_)
    if (s) ::munmap(s, segmentBytes_);
  ::close(fd_);
}

StatusOr<void*> SharedHeap::allocate(size_t bytes) {
  const size_t size = roundUp(std::max<size_t>(bytes, 1), kAlignment);
  std::lock_guard lock(mu_);
  auto it = free_.begin();
  while (it != free_.end() && it->second < size) ++it;  // first fit
  if (it == free_.end())
    return Status(StatusCode::kResourceExhausted, fmt::format("no {} MiB range is left in this rank's shared segment",
                                                              size >> 20));
  const size_t offset = it->first;
  if (::fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(size)) != 0) {
    const int e = errno;
    ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(size));
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("reserving {} MiB of shared memory in /dev/shm: {}", size >> 20, std::strerror(e)));
  }
  const size_t rest = it->second - size;
  free_.erase(it);
  if (rest > 0) free_[offset + size] = rest;
  used_[offset] = size;
  return static_cast<void*>(segments_[rank_] + offset);
}

void SharedHeap::release(void* p) {
  const size_t offset = static_cast<size_t>(static_cast<char*>(p) - segments_[rank_]);
  std::lock_guard lock(mu_);
  auto it = used_.find(offset);
  if (it == used_.end()) return;
  size_t begin = offset, size = it->second;
  used_.erase(it);
  ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(begin), static_cast<off_t>(size));
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == begin + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      prev->second += size;
      return;
    }
  }
  free_[begin] = size;
}

int64_t SharedHeap::offsetOf(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  if (c < segments_[rank_] || c >= segments_[rank_] + segmentBytes_) return -1;
  const size_t offset = static_cast<size_t>(c - segments_[rank_]);
  std::lock_guard lock(mu_);
  auto it = used_.upper_bound(offset);
  if (it == used_.begin()) return -1;
  --it;
  return offset + bytes <= it->first + it->second ? static_cast<int64_t>(offset) : -1;
}

SharedHeap::Header& SharedHeap::header(int worldRank) const { return *reinterpret_cast<Header*>(segments_[worldRank]); }

SharedHeap::GroupLines& SharedHeap::lines(int worldRank, uint32_t group) const {
  static_assert(kPage + kMaxGroups * sizeof(GroupLines) <= kHeaderBytes, "the groups' lines must fit in the header");
  return *reinterpret_cast<GroupLines*>(segments_[worldRank] + kPage + static_cast<size_t>(group) * sizeof(GroupLines));
}

namespace {

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is in memory other processes map.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

// Sequentially consistent, so that a sleeper either sees the new value before it sleeps or is
// counted here and woken.
void SharedHeap::publish(Counter& c, uint64_t value) {
  c.value.store(value, std::memory_order_seq_cst);
  c.generation.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) > 0) futex(&c.generation, FUTEX_WAKE, INT32_MAX, nullptr);
}

void SharedHeap::enter(uint32_t group, uint64_t round, Entry mine) {
  GroupLines& l = lines(rank_, group);
  GroupLines::Place& place = l.entries[round % 2];
  place.tag.store(GroupLines::kNoRound, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  place.offset.store(mine.offset, std::memory_order_relaxed);
  place.bytes.store(mine.bytes, std::memory_order_relaxed);
  place.tag.store(round + 1, std::memory_order_release);
  publish(l.entered, round + 1);
}

SharedHeap::Entry SharedHeap::entryOf(int worldRank, uint32_t group, uint64_t round) const {
  const GroupLines::Place& place = lines(worldRank, group).entries[round % 2];
  const uint64_t before = place.tag.load(std::memory_order_acquire);
  const Entry e{place.offset.load(std::memory_order_relaxed), place.bytes.load(std::memory_order_relaxed)};
  std::atomic_thread_fence(std::memory_order_acquire);
  const uint64_t after = place.tag.load(std::memory_order_relaxed);
  // Another round's entry (see the header): this rank's tensor of `round` was not in the heap.
  if (before != round + 1 || after != round + 1) return {-1, e.bytes};
  return e;
}

void SharedHeap::leave(uint32_t group, uint64_t round) {
  publish(lines(rank_, group).left, round + 1);
}

Status SharedHeap::awaitEntered(uint32_t group, const std::vector<int>& worldRanks, uint64_t round,
                             std::chrono::steady_clock::time_point deadline, const std::string& what,
                             const WaitHooks& hooks) const {
  return awaitAll(/*entered=*/true, group, worldRanks, round, deadline, what, hooks);
}

Status SharedHeap::awaitLeft(uint32_t group, const std::vector<int>& worldRanks, uint64_t round,
                             std::chrono::steady_clock::time_point deadline, const std::string& what,
                             const WaitHooks& hooks) const {
  return awaitAll(/*entered=*/false, group, worldRanks, round, deadline, what, hooks);
}

Status SharedHeap::awaitAll(bool entered, uint32_t group, const std::vector<int>& worldRanks, uint64_t round,
                            std::chrono::steady_clock::time_point deadline, const std::string& what,
                            const WaitHooks& hooks) const {
  // Spin while the wait is likely short and every rank has a core; then sleep on the counter's
  // futex, waking now and then to check the rank's process and the deadline.
  const auto spinFor = oversubscribed_ ? std::chrono::microseconds(20) : std::chrono::microseconds(2000);
  const timespec nap{0, 20'000'000};
  for (int r : worldRanks) {
    GroupLines& l = lines(r, group);
    Counter& c = entered ? l.entered : l.left;
    const auto start = std::chrono::steady_clock::now();
    bool settled = false;
    for (uint64_t spins = 0; c.value.load(std::memory_order_acquire) < round + 1; ++spins) {
      if (spins % 64 != 0 || std::chrono::steady_clock::now() - start < spinFor) {
        if (hooks.poll) hooks.poll();
        cpuRelax();
        continue;
      }
      if (!settled && hooks.settle) {
        RETURN_IF_ERROR(hooks.settle());
        settled = true;
        continue;
      }
      const uint32_t generation = c.generation.load(std::memory_order_seq_cst);
      c.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (c.value.load(std::memory_order_seq_cst) < round + 1) futex(&c.generation, FUTEX_WAIT, generation, &nap);
      c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      // A rank may get there and exit while this one sleeps (the last collective of a job): only
      // a rank that has not got there counts as gone.
      auto there = [&] { return c.value.load(std::memory_order_acquire) >= round + 1; };
      if (there()) break;
      const Header& owner = header(r);
      if (!processLives(owner.pid, owner.startTime) && !there())
        return unavailable("world rank {} (pid {}) exited; this rank was waiting for {}", r, owner.pid, what);
      if (std::chrono::steady_clock::now() > deadline && !there())
        return Status(StatusCode::kDeadlineExceeded, fmt::format("{} (world rank {})", what, r));
    }
  }
  return Status::ok();
}

}  // namespace loom::backends
