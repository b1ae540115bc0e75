#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/rendezvous/store.h"
#include "common/status.h"

namespace loom::backends {

// Memory that every rank on this host maps, as torch's symmetric memory and NCCL's registered
// buffers are for GPUs. Each rank owns one segment: a file in /dev/shm as large as the host's
// memory but sparse (pages exist only where something is allocated), mapped by every rank and
// unlinked once they all have it, so nothing outlives the job. A rank allocates tensors from its
// own segment (Communicator::allocate); a collective whose tensors all lie in segments reads and
// writes the peers' tensors in place, one pass over memory where messages cost two.
//
// The first 2 MiB of each segment hold the owner's pid and, per communicator group, the
// lines the ranks synchronize on: for each round (one in-place collective) a rank publishes where
// its tensor lies and that it has entered, then that it has left.
class SharedHeap {
 public:
  // Every rank of the world calls it at the same point, when they are all on this host. The
  // segments are named by a token rank 0 draws and passes through `store`. When some rank cannot
  // set up its part, every rank gets an error naming it.
  static StatusOr<std::shared_ptr<SharedHeap>> create(Store& store, int rank, int worldSize,
                                                      std::chrono::milliseconds timeout);
  ~SharedHeap();
  SharedHeap(const SharedHeap&) = delete;
  SharedHeap& operator=(const SharedHeap&) = delete;

  // `bytes` of this rank's segment, in whole 2 MiB units, its pages reserved now, so that a full
  // /dev/shm fails here (ResourceExhausted) rather than as a SIGBUS on first touch. The pages
  // start zeroed. Thread-safe, like release().
  StatusOr<void*> allocate(size_t bytes);
  // Gives the pages of an allocation back to the host.
  void release(void* p);
  // The offset in this rank's segment of [p, p + bytes) when it lies inside one allocation, else
  // -1.
  int64_t offsetOf(const void* p, size_t bytes) const;
  char* segment(int worldRank) const { return segments_[worldRank]; }

  // Where one rank's tensor of a round lies: an offset in its segment (-1: not in it) and a size.
  struct Entry {
    int64_t offset = -1;
    int64_t bytes = 0;
  };
  static constexpr uint32_t kMaxGroups = 4096;  // group ids of UCX tags are 12 bits
  // Publishes this rank's entry of `round` of `group`, then that it has entered the round.
  void enter(uint32_t group, uint64_t round, Entry mine);
  // Entry of `worldRank` for `round`, once awaitEntered() has seen it enter. Entries alternate
  // between two places. When an op runs in place every rank waits for all to leave, so nobody
  // writes round k + 2 before the others have read round k. Otherwise a rank may run ahead
  // (its tensor was not in the heap, or it was a broadcast's non-root, whose entry does not
  // decide): a place that holds a later round then reads as "not in the heap" (offset -1),
  // which is what it was, or does not matter.
  Entry entryOf(int worldRank, uint32_t group, uint64_t round) const;
  void leave(uint32_t group, uint64_t round);
  // What a waiting rank does besides watching the counters. Peers may still need its messaging
  // to move (a UCX send of an earlier operation still queued here, or its acknowledgement): it
  // polls while it spins, and settles (delivers everything in flight) before it sleeps.
  struct WaitHooks {
    std::function<void()> poll;
    std::function<Status()> settle;
  };
  // Wait until every rank of `worldRanks` has entered (left) `round`. Fail naming the rank when
  // its process is gone (Unavailable), or when `deadline` passes first (DeadlineExceeded: "`what`
  // (world rank 2)"); `what` says what was waited for.
  Status awaitEntered(uint32_t group, const std::vector<int>& worldRanks, uint64_t round,
                      std::chrono::steady_clock::time_point deadline, const std::string& what,
                      const WaitHooks& hooks) const;
  Status awaitLeft(uint32_t group, const std::vector<int>& worldRanks, uint64_t round,
                   std::chrono::steady_clock::time_point deadline, const std::string& what,
                   const WaitHooks& hooks) const;

 private:
  struct Header;
  // A rank's progress through a group's rounds, on a cache line of its own (peers spin on it).
  struct alignas(64) Counter {
    std::atomic<uint64_t> value{0};       // the last round entered (left), plus one
    std::atomic<uint32_t> generation{0};  // a futex word: moves on with every change of `value`
    std::atomic<uint32_t> sleepers{0};    // ranks asleep on it (or about to be)
  };
  struct GroupLines;
  SharedHeap(int rank, int fd, size_t segmentBytes, std::vector<char*> segments, bool oversubscribed);
  Header& header(int worldRank) const;
  GroupLines& lines(int worldRank, uint32_t group) const;
  // Sets a counter of this rank's lines and wakes the ranks asleep on it.
  static void publish(Counter& counter, uint64_t value);
  Status awaitAll(bool entered, uint32_t group, const std::vector<int>& worldRanks, uint64_t round,
                  std::chrono::steady_clock::time_point deadline, const std::string& what,
                  const WaitHooks& hooks) const;

  int rank_;
  int fd_;               // this rank's segment: for reserving and punching out pages
  size_t segmentBytes_;  // of every segment
  std::vector<char*> segments_;  // by world rank; this rank's own among them
  // Whether a waiting rank sleeps almost at once: when the ranks outnumber the cores they may
  // run on, the rank waited for may need this one.
  bool oversubscribed_;

  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_;  // offset -> bytes
};

}  // namespace loom::backends
