#include "tests/conformance/conformance_body.h"

#include <cstdio>

#include <ATen/ATen.h>

namespace loom::conformance {

namespace {

using backends::Communicator;
using backends::ReduceOp;

// Where the tensors handed to collectives come from.
enum class Memory {
  kOrdinary,     // at::empty and friends
  kAllocated,    // Communicator::allocate on every rank (the UCX backend's in-place path)
  kEvenRanks,    // allocate on even ranks only: every rank must take the message path alike
};

struct Checker {
  at::Device device;
  int failures = 0;
  Communicator* comm = nullptr;
  Memory memory = Memory::kOrdinary;

  void check(bool ok, const std::string& what) {
    if (ok) return;
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
    std::fflush(stdout);
  }
  void checkOk(const Status& s, const std::string& what) { check(s.isOk(), what + ": " + s.toString()); }
  at::Tensor on(const at::Tensor& t) const {
    const bool allocated = memory == Memory::kAllocated || (memory == Memory::kEvenRanks && comm->rank() % 2 == 0);
    if (!allocated) return t.to(device);
    at::Tensor a = comm->allocate(t.sizes(), t.scalar_type());
    return a.copy_(t);
  }
  static bool same(const at::Tensor& a, const at::Tensor& b) { return at::equal(a.cpu(), b.cpu()); }
};

// Rank r's element i: (r + 1) * (i % 7 + 1).
at::Tensor input(int rank, int64_t n, at::ScalarType dtype) {
  return ((at::arange(n, at::kLong) % 7 + 1) * (rank + 1)).to(dtype);
}

void allReduceChecks(Checker& k, Communicator& c, const std::string& where) {
  const int n = c.size();
  const double sumRanks = n * (n + 1) / 2.0;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    for (int64_t count : {1, 7, 1000, 100003, 3'000'001}) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        if (op == ReduceOp::kAvg && dtype == at::kLong) continue;
        if (count > 100003 && (dtype != at::kFloat || op != ReduceOp::kSum)) continue;
        auto t = k.on(input(c.rank(), count, dtype));
        auto base = (at::arange(count, at::kLong) % 7 + 1).to(at::kDouble);
        double factor = op == ReduceOp::kSum ? sumRanks : op == ReduceOp::kAvg ? sumRanks / n : op == ReduceOp::kMax ? n : 1;
        std::string what = where + " all_reduce " + backends::reduceOpName(op) + " " + c10::toString(dtype) + " x" +
                           std::to_string(count);
        k.checkOk(c.allReduce(t, op)->wait(), what);
        k.check(Checker::same(t, (base * factor).to(dtype)), what + ": wrong values");
      }
    }
  }
  Status refused = c.allReduce(k.on(input(c.rank(), 4, at::kLong)), ReduceOp::kAvg)->wait();
  k.check(refused.code() == StatusCode::kInvalidArgument && refused.message().find("avg") != std::string::npos,
          where + " avg on int64 must be refused: " + refused.toString());
}

void gatherScatterChecks(Checker& k, Communicator& c, const std::string& where) {
  const int n = c.size(), r = c.rank();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    for (int64_t part : {1, 5, 40001}) {
      std::string suffix = std::string(" ") + c10::toString(dtype) + " part " + std::to_string(part);
      auto mine = k.on(input(r, part, dtype));
      auto gathered = k.on(at::empty({part * n}, dtype));
      k.checkOk(c.allGather(gathered, mine)->wait(), where + " all_gather" + suffix);
      for (int j = 0; j < n; ++j)
        k.check(Checker::same(gathered.slice(0, j * part, (j + 1) * part), input(j, part, dtype)),
                where + " all_gather" + suffix);
      auto full = k.on(input(r, part * n, dtype));
      auto out = k.on(at::empty({part}, dtype));
      k.checkOk(c.reduceScatter(out, full, ReduceOp::kSum)->wait(), where + " reduce_scatter" + suffix);
      auto all = (at::arange(part * n, at::kLong) % 7 + 1).to(at::kDouble) * (n * (n + 1) / 2.0);
      k.check(Checker::same(out, all.slice(0, r * part, (r + 1) * part).to(dtype)), where + " reduce_scatter" + suffix);
      // all_to_all: part j of rank i's input lands in part i of rank j's output. Values stay
      // small (exact in half precision): position mod 7, plus 10 per source rank.
      auto send = k.on((at::arange(part * n, at::kLong) % 7 + 10 * r).to(dtype));
      auto recv = k.on(at::empty_like(send));
      k.checkOk(c.allToAll(recv, send)->wait(), where + " all_to_all" + suffix);
      for (int i = 0; i < n; ++i) {
        auto expect = (at::arange(r * part, (r + 1) * part, at::kLong) % 7 + 10 * i).to(dtype);
        k.check(Checker::same(recv.slice(0, i * part, (i + 1) * part), expect), where + " all_to_all" + suffix);
      }
    }
  }
  // all_to_all_v: rank i sends (i + j + 1) elements, all equal to 100 * i + j, to rank j.
  std::vector<int64_t> inSplits, outSplits;
  for (int j = 0; j < n; ++j) inSplits.push_back(r + j + 1);
  for (int i = 0; i < n; ++i) outSplits.push_back(i + r + 1);
  std::vector<at::Tensor> pieces;
  for (int j = 0; j < n; ++j) pieces.push_back(at::full({inSplits[j]}, 100 * r + j, at::kLong));
  int64_t total = 0;
  for (auto s : outSplits) total += s;
  auto recv = k.on(at::full({total}, -1, at::kLong));
  k.checkOk(c.allToAllV(recv, k.on(at::cat(pieces)), outSplits, inSplits)->wait(), where + " all_to_all_v");
  int64_t off = 0;
  for (int i = 0; i < n; ++i) {
    k.check(Checker::same(recv.slice(0, off, off + outSplits[i]), at::full({outSplits[i]}, 100 * i + r, at::kLong)),
            where + " all_to_all_v from rank " + std::to_string(i));
    off += outSplits[i];
  }
}

void pointToPointChecks(Checker& k, Communicator& c, const std::string& where) {
  const int n = c.size(), r = c.rank();
  for (int64_t count : {3, 1 << 20}) {
    for (int root = 0; root < n; ++root) {
      auto t = k.on(r == root ? input(root, count, at::kFloat) : at::zeros({count}, at::kFloat));
      k.checkOk(c.broadcast(t, root)->wait(), where + " broadcast");
      k.check(Checker::same(t, input(root, count, at::kFloat)), where + " broadcast from " + std::to_string(root));
    }
  }
  // A ring of point-to-point messages, large enough not to be buffered: operations run in issue
  // order, so even ranks send first and odd ranks receive first.
  for (int64_t count : {1000, 1 << 20}) {
    auto out = k.on(input(r, count, at::kFloat));
    auto in = k.on(at::zeros({count}, at::kFloat));
    std::shared_ptr<backends::Work> s, v;
    if (r % 2 == 0) {
      s = c.send(out, (r + 1) % n, 7);
      v = c.recv(in, (r - 1 + n) % n, 7);
    } else {
      v = c.recv(in, (r - 1 + n) % n, 7);
      s = c.send(out, (r + 1) % n, 7);
    }
    k.checkOk(s->wait(), where + " send");
    k.checkOk(v->wait(), where + " recv");
    k.check(Checker::same(in, input((r - 1 + n) % n, count, at::kFloat)), where + " recv values");
  }
  k.checkOk(c.barrier()->wait(), where + " barrier");
  // Misuse is an error on the Work, at once.
  auto out = k.on(input(r, 1000, at::kFloat));
  Status bad = c.send(out, r, 0)->wait();
  k.check(bad.code() == StatusCode::kInvalidArgument, where + " send to self must be refused: " + bad.toString());
  Status mismatch = c.allGather(k.on(at::empty({3}, at::kFloat)), out)->wait();
  k.check(mismatch.code() == StatusCode::kInvalidArgument && mismatch.message().find("output") != std::string::npos,
          where + " all_gather shape mismatch must be refused: " + mismatch.toString());
}

void runOn(Checker& k, Communicator& c, Memory memory) {
  k.comm = &c;
  k.memory = memory;
  const std::string where = c.name() + (memory == Memory::kAllocated   ? " (allocated tensors)"
                                        : memory == Memory::kEvenRanks ? " (allocated on even ranks)"
                                                                       : "");
  allReduceChecks(k, c, where);
  gatherScatterChecks(k, c, where);
  pointToPointChecks(k, c, where);
}

}  // namespace

int runAll(Communicator& world, at::Device device) {
  Checker k{device};
  runOn(k, world, Memory::kOrdinary);
  runOn(k, world, Memory::kAllocated);
  runOn(k, world, Memory::kEvenRanks);
  // Sub-groups: even and odd ranks.
  std::vector<int> even, odd;
  for (int r = 0; r < world.size(); ++r) (r % 2 ? odd : even).push_back(r);
  auto evens = world.split(even, "even");
  auto odds = world.split(odd, "odd");
  k.checkOk(evens.status(), "split even");
  k.checkOk(odds.status(), "split odd");
  if (evens.isOk() && odds.isOk()) {
    auto& mine = world.rank() % 2 ? *odds : *evens;
    k.check(mine != nullptr, "this rank is in its group");
    k.check((world.rank() % 2 ? *evens : *odds) == nullptr, "not in the other group");
    if (mine && mine->size() > 1) {
      runOn(k, *mine, Memory::kOrdinary);
      runOn(k, *mine, Memory::kAllocated);
    }
  }
  k.checkOk(world.barrier()->wait(), "final barrier");
  return k.failures;
}

}  // namespace loom::conformance
