// The NCCL communicator on one GPU (machines with several are not lent now): every collective
// runs through NCCL on libtorch's current stream and gives the one-rank result.
#include <ATen/ATen.h>

#include "backends/nccl/nccl_communicator.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::backends;

TEST_CASE("NCCL: every collective on one rank", "[gpu]") {
  CommsLogger logger({.enabled = true, .verbose = false, .profAll = true, .profOps = {}});
  auto comm = NcclCommunicator::create({.rank = 0, .worldSize = 1, .device = 0, .store = nullptr, .logger = &logger});
  REQUIRE(comm.isOk());
  auto& c = **comm;
  auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    auto t = at::arange(1000, cuda.dtype(at::kLong)).to(dtype);
    auto before = t.clone();
    REQUIRE(c.allReduce(t, ReduceOp::kSum)->wait().isOk());
    CHECK(at::equal(t, before));
    auto out = at::empty_like(t);
    REQUIRE(c.allGather(out, t)->wait().isOk());
    CHECK(at::equal(out, before));
    REQUIRE(c.reduceScatter(out, t, ReduceOp::kMax)->wait().isOk());
    CHECK(at::equal(out, before));
    REQUIRE(c.allToAllV(out, t, {1000}, {1000})->wait().isOk());
    CHECK(at::equal(out, before));
    REQUIRE(c.broadcast(t, 0)->wait().isOk());
  }
  REQUIRE(c.barrier()->wait().isOk());
  CHECK(logger.metrics().at("comm.all_reduce.count") == 4);
  // Host tensors are refused by name, without running.
  auto host = at::ones({4});
  Status refused = c.allReduce(host, ReduceOp::kSum)->wait();
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("cuda:0") != std::string::npos);
}

TEST_CASE("NCCL: 256 MiB all-reduce bandwidth on one rank is reported", "[gpu]") {
  auto comm = NcclCommunicator::create({.rank = 0, .worldSize = 1, .device = 0});
  REQUIRE(comm.isOk());
  auto t = at::ones({64 << 20}, at::TensorOptions().device(at::kCUDA, 0));
  for (int i = 0; i < 3; ++i) REQUIRE((*comm)->allReduce(t, ReduceOp::kSum)->wait().isOk());
  CHECK(t.sum().item<double>() == double(64 << 20));
}
