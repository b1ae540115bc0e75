// One rank of the communicator conformance suite: runs every collective over every dtype, on
// uneven sizes and sub-groups, and compares with exact expectations (the values are small
// integers, exact in every dtype). Started N times by comm_conformance_test.cc with RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT; exits 0 when every check passed.
//
// LOOM_CONFORMANCE_MODE selects a failure scenario instead:
//   peer-stops   the last rank stops answering; the others' all-reduce must fail in time,
//                naming it;
//   missing-rank the last rank never starts; rendezvous must fail, naming it.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include "backends/rendezvous/tcp_store.h"
#include "backends/ucx/ucx_communicator.h"

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

void checkOk(const Status& s, const std::string& what) { check(s.isOk(), what + ": " + s.toString()); }

// Rank r's element i: (r + 1) * (i % 7 + 1).
at::Tensor input(int rank, int64_t n, at::ScalarType dtype) {
  auto i = at::arange(n, at::kLong);
  return ((i % 7 + 1) * (rank + 1)).to(dtype);
}

void allReduceChecks(Communicator& c, const std::string& where) {
  const int n = c.size();
  const double sumRanks = n * (n + 1) / 2.0;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    for (int64_t count : {1, 7, 1000, 100003, 3'000'001}) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        if (op == ReduceOp::kAvg && dtype == at::kLong) continue;
        if (count > 100003 && (dtype != at::kFloat || op != ReduceOp::kSum)) continue;
        auto t = input(c.rank(), count, dtype);
        auto base = (at::arange(count, at::kLong) % 7 + 1).to(at::kDouble);
        double factor = op == ReduceOp::kSum ? sumRanks : op == ReduceOp::kAvg ? sumRanks / n : op == ReduceOp::kMax ? n : 1;
        auto expected = (base * factor).to(dtype);
        std::string what = where + " all_reduce " + reduceOpName(op) + " " + c10::toString(dtype) + " x" + std::to_string(count);
        checkOk(c.allReduce(t, op)->wait(), what);
        check(at::equal(t, expected), what + ": wrong values");
      }
    }
  }
  // avg on integers is refused with a reason, without running.
  auto ints = input(c.rank(), 4, at::kLong);
  Status refused = c.allReduce(ints, ReduceOp::kAvg)->wait();
  check(refused.code() == StatusCode::kInvalidArgument && refused.message().find("avg") != std::string::npos,
        where + " avg on int64 must be refused: " + refused.toString());
}

void gatherScatterChecks(Communicator& c, const std::string& where) {
  const int n = c.size(), r = c.rank();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    for (int64_t part : {1, 5, 40001}) {
      std::string suffix = std::string(" ") + c10::toString(dtype) + " part " + std::to_string(part);
      // all_gather: part j comes from rank j.
      auto mine = input(r, part, dtype);
      auto gathered = at::empty({part * n}, mine.options());
      checkOk(c.allGather(gathered, mine)->wait(), where + " all_gather" + suffix);
      for (int j = 0; j < n; ++j)
        check(at::equal(gathered.slice(0, j * part, (j + 1) * part), input(j, part, dtype)), where + " all_gather" + suffix);
      // reduce_scatter: this rank's part of the sum.
      auto full = input(r, part * n, dtype);
      auto out = at::empty({part}, full.options());
      checkOk(c.reduceScatter(out, full, ReduceOp::kSum)->wait(), where + " reduce_scatter" + suffix);
      auto all = (at::arange(part * n, at::kLong) % 7 + 1).to(at::kDouble) * (n * (n + 1) / 2.0);
      check(at::equal(out, all.slice(0, r * part, (r + 1) * part).to(dtype)), where + " reduce_scatter" + suffix);
      // all_to_all: part j of rank i's input lands in part i of rank j's output.
      // Values stay small (exact in half precision): position mod 7, plus 10 per source rank.
      auto send = (at::arange(part * n, at::kLong) % 7 + 10 * r).to(dtype);
      auto recv = at::empty_like(send);
      checkOk(c.allToAll(recv, send)->wait(), where + " all_to_all" + suffix);
      for (int i = 0; i < n; ++i) {
        auto expect = (at::arange(r * part, (r + 1) * part, at::kLong) % 7 + 10 * i).to(dtype);
        check(at::equal(recv.slice(0, i * part, (i + 1) * part), expect), where + " all_to_all" + suffix);
      }
    }
  }
  // all_to_all_v: rank i sends (i + j + 1) elements, all equal to 100 * i + j, to rank j.
  std::vector<int64_t> inSplits, outSplits;
  for (int j = 0; j < n; ++j) inSplits.push_back(r + j + 1);
  for (int i = 0; i < n; ++i) outSplits.push_back(i + r + 1);
  std::vector<at::Tensor> pieces;
  for (int j = 0; j < n; ++j) pieces.push_back(at::full({inSplits[j]}, 100 * r + j, at::kLong));
  auto send = at::cat(pieces);
  int64_t total = 0;
  for (auto s : outSplits) total += s;
  auto recv = at::full({total}, -1, at::kLong);
  checkOk(c.allToAllV(recv, send, outSplits, inSplits)->wait(), where + " all_to_all_v");
  int64_t off = 0;
  for (int i = 0; i < n; ++i) {
    check(at::equal(recv.slice(0, off, off + outSplits[i]), at::full({outSplits[i]}, 100 * i + r, at::kLong)),
          where + " all_to_all_v from rank " + std::to_string(i));
    off += outSplits[i];
  }
}

void pointToPointChecks(Communicator& c, const std::string& where) {
  const int n = c.size(), r = c.rank();
  for (int64_t count : {3, 1 << 20}) {
    for (int root = 0; root < n; ++root) {
      auto t = r == root ? input(root, count, at::kFloat) : at::zeros({count}, at::kFloat);
      checkOk(c.broadcast(t, root)->wait(), where + " broadcast");
      check(at::equal(t, input(root, count, at::kFloat)), where + " broadcast from " + std::to_string(root));
    }
  }
  // A ring of point-to-point messages: to the right, from the left.
  auto out = input(r, 1000, at::kFloat);
  auto in = at::zeros({1000}, at::kFloat);
  auto s = c.send(out, (r + 1) % n, 7);
  auto v = c.recv(in, (r - 1 + n) % n, 7);
  checkOk(s->wait(), where + " send");
  checkOk(v->wait(), where + " recv");
  check(at::equal(in, input((r - 1 + n) % n, 1000, at::kFloat)), where + " recv values");
  checkOk(c.barrier()->wait(), where + " barrier");
  // Misuse is an error on the Work, at once.
  Status bad = c.send(out, r, 0)->wait();
  check(bad.code() == StatusCode::kInvalidArgument, where + " send to self must be refused: " + bad.toString());
  auto wrong = at::empty({3}, at::kFloat);
  Status mismatch = c.allGather(wrong, out)->wait();
  check(mismatch.code() == StatusCode::kInvalidArgument && mismatch.message().find("output") != std::string::npos,
        where + " all_gather shape mismatch must be refused: " + mismatch.toString());
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
  if (mode == "peer-stops") options.operationTimeout = std::chrono::seconds(3);
  auto transport = UcxTransport::create(options);
  if (mode == "missing-rank") {
    check(!transport.isOk() && transport.status().message().find("rank " + std::to_string(world - 1) + " did not join") !=
                                   std::string::npos,
          "rendezvous without the last rank must fail naming it: " + transport.status().toString());
    std::printf("%s\n", transport.status().toString().c_str());
    return failures == 0 ? 0 : 1;
  }
  if (!transport.isOk()) {
    std::printf("FAIL transport: %s\n", transport.status().toString().c_str());
    return 1;
  }
  auto worldComm = UcxCommunicator::world(*transport);

  if (mode == "peer-stops") {
    checkOk(worldComm->barrier()->wait(), "barrier before the stop");
    if (rank == world - 1) {
      std::this_thread::sleep_for(std::chrono::seconds(6));  // silent past the others' timeout
      return 0;
    }
    auto t = input(rank, 1 << 20, at::kFloat);
    Status s = worldComm->allReduce(t, ReduceOp::kSum)->wait(std::chrono::seconds(30));
    std::printf("%s\n", s.toString().c_str());
    check(s.code() == StatusCode::kDeadlineExceeded, "a silent peer must fail the all-reduce: " + s.toString());
    check(s.message().find("all_reduce") != std::string::npos, "the error names the op");
    // Later operations fail at once with the first error.
    Status after = worldComm->barrier()->wait(std::chrono::seconds(5));
    check(after.message().find("failed earlier") != std::string::npos, "later ops fail at once: " + after.toString());
    return failures == 0 ? 0 : 1;
  }

  allReduceChecks(*worldComm, "world");
  gatherScatterChecks(*worldComm, "world");
  pointToPointChecks(*worldComm, "world");

  // Sub-groups: even and odd ranks, then a group of one.
  std::vector<int> even, odd;
  for (int r = 0; r < world; ++r) (r % 2 ? odd : even).push_back(r);
  auto evens = worldComm->split(even, "even");
  auto odds = worldComm->split(odd, "odd");
  checkOk(evens.status(), "split even");
  checkOk(odds.status(), "split odd");
  auto& mine = rank % 2 ? *odds : *evens;
  check(mine != nullptr, "this rank is in its group");
  check((rank % 2 ? *evens : *odds) == nullptr, "not in the other group");
  if (mine && mine->size() > 1) {
    allReduceChecks(*mine, mine->name());
    gatherScatterChecks(*mine, mine->name());
    pointToPointChecks(*mine, mine->name());
  }
  checkOk(worldComm->barrier()->wait(), "final barrier");
  std::printf("%s: rank %d of %d, %d failures\n", failures ? "FAILED" : "PASSED", rank, world, failures);
  return failures == 0 ? 0 : 1;
}
