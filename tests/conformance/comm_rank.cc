// One rank of the UCX communicator's conformance suite (conformance_body.h). Started N times by
// comm_conformance_test.cc with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; exits 0 when
// every check passed.
//
// LOOM_CONFORMANCE_MODE selects a failure scenario instead:
//   peer-stops   the last rank stops answering; the others' all-reduce must fail in time,
//                naming it;
//   missing-rank the last rank never starts; rendezvous must fail, naming it;
//   size-mismatch rank 1 expects a smaller (then a larger) broadcast than rank 0 sends; it must
//                fail naming the sizes.
// and for tensors from Communicator::allocate (the shared-memory path):
//   shared-peer-stops  as peer-stops;
//   shared-peer-exits  the last rank's process exits; the others must fail at once, naming it;
//   shared-size-mismatch  rank 1's all-reduce tensor is half rank 0's: both fail, naming the sizes;
//   shared-refused-call  rank 0 refuses an all-gather (its output is too small) that rank 1 makes,
//                then both make another: no call may pair with another, every later one fails.
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include "backends/rendezvous/tcp_store.h"
#include "backends/ucx/ucx_communicator.h"
#include "tests/conformance/conformance_body.h"

using namespace loom;
using namespace loom::backends;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
    std::fflush(stdout);
  }
}

int env(const char* name) { return std::atoi(std::getenv(name)); }

}  // namespace

int main() {
  const int rank = env("RANK"), world = env("WORLD_SIZE");
  const std::string mode = std::getenv("LOOM_CONFORMANCE_MODE") ? std::getenv("LOOM_CONFORMANCE_MODE") : "";
  auto store = TcpStore::connect({.host = std::getenv("MASTER_ADDR"), .port = env("MASTER_PORT"),
                                  .isServer = rank == 0, .connectTimeout = std::chrono::seconds(30)});
  if (!store.isOk()) {
    std::printf("FAIL store: %s\n", store.status().toString().c_str());
    return 1;
  }
  UcxOptions options{.rank = rank, .worldSize = world, .store = store->get()};
  if (mode == "missing-rank") options.rendezvousTimeout = std::chrono::seconds(5);
  if (mode.find("peer-") != std::string::npos || mode == "shared-refused-call")
    options.operationTimeout = std::chrono::seconds(3);
  auto transport = UcxTransport::create(options);
  if (mode == "missing-rank") {
    check(!transport.isOk() && transport.status().message().find("rank " + std::to_string(world - 1) + " did not join") !=
                                   std::string::npos,
          "rendezvous without the last rank must fail naming it: " + transport.status().toString());
    std::printf("%s\n", transport.status().toString().c_str());
    // Rank 0 serves the store: it stays a moment, so the others meet their own timeout rather
    // than a closed store.
    if (rank == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    return failures == 0 ? 0 : 1;
  }
  if (!transport.isOk()) {
    std::printf("FAIL transport: %s\n", transport.status().toString().c_str());
    return 1;
  }
  auto worldComm = UcxCommunicator::world(*transport);

  if (mode == "size-mismatch") {
    auto big = at::ones({1000}, at::kFloat);
    auto small = at::ones({500}, at::kFloat);
    Status s = worldComm->broadcast(rank == 0 ? big : small, 0)->wait();
    std::printf("%s\n", s.toString().c_str());
    if (rank == 0) {
      check(s.isOk(), "the root's send completes");
    } else {
      check(s.code() == StatusCode::kInvalidArgument, "a receive of another size is an error: " + s.toString());
      check(s.message().find("rank 0 sent more than the 2000 bytes expected") != std::string::npos,
            "the error names the sender and the size: " + s.toString());
    }
    return failures == 0 ? 0 : 1;
  }

  if (mode == "shared-peer-exits") {
    check(worldComm->barrier()->wait().isOk(), "barrier before the exit");
    if (rank == world - 1) std::_Exit(0);
    auto t = worldComm->allocate({1 << 20}, at::kFloat).fill_(1);
    const auto start = std::chrono::steady_clock::now();
    Status s = worldComm->allReduce(t, ReduceOp::kSum)->wait(std::chrono::seconds(30));
    std::printf("%s\n", s.toString().c_str());
    check(s.code() == StatusCode::kUnavailable, "a peer that exited must fail the all-reduce: " + s.toString());
    check(s.message().find("rank " + std::to_string(world - 1)) != std::string::npos &&
              s.message().find("exited") != std::string::npos,
          "the error names the rank that exited");
    check(std::chrono::steady_clock::now() - start < std::chrono::seconds(2), "well before the 3 s timeout");
    return failures == 0 ? 0 : 1;
  }

  if (mode == "shared-size-mismatch") {
    auto t = worldComm->allocate({rank == 0 ? 1000 : 500}, at::kFloat).fill_(1);
    Status s = worldComm->allReduce(t, ReduceOp::kSum)->wait(std::chrono::seconds(30));
    std::printf("%s\n", s.toString().c_str());
    check(s.code() == StatusCode::kInvalidArgument, "tensors of different sizes are an error: " + s.toString());
    const std::string other = rank == 0 ? "rank 1's tensor holds 2000 bytes, this rank's 4000"
                                        : "rank 0's tensor holds 4000 bytes, this rank's 2000";
    check(s.message().find(other) != std::string::npos, "the error names the rank and both sizes: " + s.toString());
    return failures == 0 ? 0 : 1;
  }

  if (mode == "shared-refused-call") {
    auto input = worldComm->allocate({1000}, at::kFloat).fill_(rank + 1);
    auto output = worldComm->allocate({rank == 0 ? 10 : 2000}, at::kFloat).fill_(0);
    Status first = worldComm->allGather(output, input)->wait(std::chrono::seconds(30));
    auto again = worldComm->allocate({2000}, at::kFloat).fill_(0);
    Status second = worldComm->allGather(again, input)->wait(std::chrono::seconds(30));
    std::printf("%s\n%s\n", first.toString().c_str(), second.toString().c_str());
    if (rank == 0) check(first.code() == StatusCode::kInvalidArgument, "the refused call fails at once: " + first.toString());
    if (rank == 1) check(!first.isOk(), "a call the other rank refused must not complete: " + first.toString());
    check(!second.isOk(), "the next call must not pair with the refused one: " + second.toString());
    return failures == 0 ? 0 : 1;
  }

  if (mode == "peer-stops" || mode == "shared-peer-stops") {
    check(worldComm->barrier()->wait().isOk(), "barrier before the stop");
    if (rank == world - 1) {
      std::this_thread::sleep_for(std::chrono::seconds(6));  // silent past the others' timeout
      return 0;
    }
    auto t = mode == "peer-stops" ? at::ones({1 << 20}, at::kFloat) : worldComm->allocate({1 << 20}, at::kFloat).fill_(1);
    Status s = worldComm->allReduce(t, ReduceOp::kSum)->wait(std::chrono::seconds(30));
    std::printf("%s\n", s.toString().c_str());
    check(s.code() == StatusCode::kDeadlineExceeded, "a silent peer must fail the all-reduce: " + s.toString());
    check(s.message().find("all_reduce") != std::string::npos, "the error names the op");
    // Later operations fail at once with the first error.
    Status after = worldComm->barrier()->wait(std::chrono::seconds(5));
    check(after.message().find("failed earlier") != std::string::npos, "later ops fail at once: " + after.toString());
    return failures == 0 ? 0 : 1;
  }

  failures += conformance::runAll(*worldComm, at::kCPU);
  std::printf("%s: rank %d of %d, %d failures\n", failures ? "FAILED" : "PASSED", rank, world, failures);
  return failures == 0 ? 0 : 1;
}
