#include "backends/ucx/shared_heap.h"

#include <cstring>
#include <future>

#include "backends/rendezvous/tcp_store.h"
#include "tests/catch.h"
#include "tests/free_port.h"

using namespace loom;
using loom::backends::SharedHeap;
using loom::backends::TcpStore;

namespace {

constexpr auto kTimeout = std::chrono::seconds(10);

// The heaps of ranks 0..n-1 of one world, made by threads of this process (create blocks until
// every rank has its segment mapped).
std::vector<std::shared_ptr<SharedHeap>> makeHeaps(int n) {
  const int port = testing::freePort();
  auto server = TcpStore::connect({.host = "127.0.0.1", .port = port, .isServer = true});
  REQUIRE(server.isOk());
  std::vector<std::future<StatusOr<std::shared_ptr<SharedHeap>>>> made;
  for (int r = 0; r < n; ++r) {
    made.push_back(std::async(std::launch::async, [&, r]() -> StatusOr<std::shared_ptr<SharedHeap>> {
      ASSIGN_OR_RETURN(auto store, TcpStore::connect({.host = "127.0.0.1", .port = port, .isServer = false}));
      return SharedHeap::create(*store, r, n, kTimeout);
    }));
  }
  std::vector<std::shared_ptr<SharedHeap>> heaps;
  for (auto& f : made) {
    auto heap = f.get();
    REQUIRE(heap.isOk());
    heaps.push_back(*heap);
  }
  return heaps;
}

}  // namespace

TEST_CASE("shared heap: allocations are found - released ranges merge and come back zeroed", "[backends]") {
  auto heap = makeHeaps(1)[0];
  auto a = heap->allocate(1000), b = heap->allocate(3 << 20), c = heap->allocate(10);
  REQUIRE(a.isOk());
  REQUIRE(b.isOk());
  REQUIRE(c.isOk());
  char* pa = static_cast<char*>(*a);
  CHECK(heap->offsetOf(pa, 1000) == pa - heap->segment(0));
  CHECK(heap->offsetOf(pa + 10, 20) == pa + 10 - heap->segment(0));
  // Allocations are whole 2 MiB units: b holds 4 MiB, and a range running past them is not in it.
  CHECK(heap->offsetOf(static_cast<char*>(*b) + (4 << 20) - 16, 16) != -1);
  CHECK(heap->offsetOf(static_cast<char*>(*b) + (4 << 20) - 8, 16) == -1);
  char local[16];
  CHECK(heap->offsetOf(local, sizeof local) == -1);

  std::memset(*b, 0x5a, 3 << 20);
  heap->release(*a);
  heap->release(*b);  // merges with a's range: one range from a's start
  auto again = heap->allocate(5 << 20);
  REQUIRE(again.isOk());
  CHECK(*again == *a);
  const char* bytes = static_cast<const char*>(*again);
  CHECK(bytes[0] == 0);
  CHECK(bytes[(3 << 20) + 100] == 0);  // b's old pages were given back
  CHECK(heap->offsetOf(*b, 8) != -1);    // now inside the new allocation

  auto huge = heap->allocate(size_t(1) << 50);
  REQUIRE(huge.status().code() == StatusCode::kResourceExhausted);
  CHECK(huge.status().message().find("no ") != std::string::npos);
}

TEST_CASE("shared heap: every rank maps the others' memory - rounds publish entries and wait", "[backends]") {
  auto heaps = makeHeaps(2);
  auto mine = heaps[0]->allocate(4096);
  REQUIRE(mine.isOk());
  std::memcpy(*mine, "written by rank 0", 18);
  const int64_t offset = heaps[0]->offsetOf(*mine, 4096);
  CHECK(std::strcmp(heaps[1]->segment(0) + offset, "written by rank 0") == 0);

  const auto soon = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  heaps[0]->enter(/*group=*/7, /*round=*/0, {offset, 4096});
  Status early = heaps[0]->awaitEntered(7, {0, 1}, 0, soon, "round 0", {});
  CHECK(early.code() == StatusCode::kDeadlineExceeded);
  CHECK(early.message() == "round 0 (world rank 1)");

  heaps[1]->enter(7, 0, {-1, 4096});
  const auto later = std::chrono::steady_clock::now() + kTimeout;
  REQUIRE(heaps[0]->awaitEntered(7, {0, 1}, 0, later, "round 0", {}).isOk());
  REQUIRE(heaps[1]->awaitEntered(7, {0, 1}, 0, later, "round 0", {}).isOk());
  CHECK(heaps[1]->entryOf(0, 7, 0).offset == offset);
  CHECK(heaps[0]->entryOf(1, 7, 0).offset == -1);
  CHECK(heaps[0]->entryOf(1, 7, 0).bytes == 4096);
  // Another group's rounds are its own.
  CHECK(heaps[0]->awaitEntered(8, {0, 1}, 0, soon, "group 8", {}).code() == StatusCode::kDeadlineExceeded);

  // A rank asleep in its wait is woken when the other leaves.
  auto waiting = std::async(std::launch::async, [&] { return heaps[0]->awaitLeft(7, {0, 1}, 0, later, "leaving", {}); });
  heaps[0]->leave(7, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  heaps[1]->leave(7, 0);
  CHECK(waiting.get().isOk());
}
