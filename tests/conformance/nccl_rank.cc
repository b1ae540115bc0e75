// One rank of the NCCL communicator's conformance suite (conformance_body.h), on cuda:LOCAL_RANK.
// Started once per GPU with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (for
// example by scripts/gpu/run-nccl-conformance); exits 0 when every check passed.
#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>

#include "backends/nccl/nccl_communicator.h"
#include "backends/rendezvous/tcp_store.h"
#include "tests/conformance/conformance_body.h"

using namespace loom;

int main() {
  const int rank = std::atoi(std::getenv("RANK")), world = std::atoi(std::getenv("WORLD_SIZE"));
  const int device = std::atoi(std::getenv("LOCAL_RANK"));
  auto store = backends::TcpStore::connect({.host = std::getenv("MASTER_ADDR"), .port = std::atoi(std::getenv("MASTER_PORT")),
                                            .isServer = rank == 0});
  if (!store.isOk()) {
    std::printf("FAIL store: %s\n", store.status().toString().c_str());
    return 1;
  }
  auto comm = backends::NcclCommunicator::create({.rank = rank, .worldSize = world, .device = device, .store = store->get()});
  if (!comm.isOk()) {
    std::printf("FAIL NCCL: %s\n", comm.status().toString().c_str());
    return 1;
  }
  int failures = conformance::runAll(**comm, at::Device(at::kCUDA, device));
  std::printf("%s: rank %d of %d on cuda:%d, %d failures\n", failures ? "FAILED" : "PASSED", rank, world, device, failures);
  return failures == 0 ? 0 : 1;
}
