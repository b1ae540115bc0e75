#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include "backends/comms_logger.h"
#include "backends/communicator.h"
#include "backends/rendezvous/store.h"

namespace loom::backends {

struct NcclOptions {
  int rank = 0;
  int worldSize = 1;
  int device = 0;                                        // CUDA device of this rank
  Store* store = nullptr;                                // for the unique id (rank 0 writes it)
  std::chrono::milliseconds rendezvousTimeout{300'000};
  std::chrono::milliseconds operationTimeout{1'800'000};  // the watchdog
  CommsLogger* logger = nullptr;

  Status validate() const;
};

// Collectives on CUDA tensors through NCCL, on a stream of the communicator's own (as c10d's NCCL
// backend does) that first waits for what libtorch's current stream has queued, the inputs: a
// collective then overlaps the compute queued after it, and a caller orders its use of the
// outputs by wait(), as with every communicator. A Work completes when that stream passes the
// operation (a CUDA event). A watchdog thread watches every pending operation: one not done by
// the timeout aborts the NCCL communicator, so that no rank hangs, and fails its Work naming the
// op; so does an asynchronous NCCL error. Later operations fail at once with the first error.
class NcclCommunicator final : public Communicator {
 public:
  static StatusOr<std::shared_ptr<NcclCommunicator>> create(const NcclOptions& options);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  std::shared_ptr<Work> allReduce(at::Tensor tensor, ReduceOp op) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor output, at::Tensor input, ReduceOp op) override;
  std::shared_ptr<Work> allGather(at::Tensor output, at::Tensor input) override;
  std::shared_ptr<Work> allToAll(at::Tensor output, at::Tensor input) override;
  std::shared_ptr<Work> allToAllV(at::Tensor output, at::Tensor input, std::vector<int64_t> outputSplits,
                                  std::vector<int64_t> inputSplits) override;
  std::shared_ptr<Work> broadcast(at::Tensor tensor, int root) override;
  std::shared_ptr<Work> send(at::Tensor tensor, int peer, int tag) override;
  std::shared_ptr<Work> recv(at::Tensor tensor, int peer, int tag) override;
  std::shared_ptr<Work> barrier() override;
  StatusOr<std::shared_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) override;
  at::Tensor allocate(at::IntArrayRef sizes, at::ScalarType dtype) override;

 private:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, std::string name, NcclOptions options);

  // Validates, enqueues `launch` (NCCL calls) on stream_ after the caller's stream has passed
  // what it queued before, ends it with an event, and hands the Work to the watchdog.
  std::shared_ptr<Work> run(const char* op, const std::string& detail, int64_t bytes, std::vector<at::Tensor> keep,
                            Status valid, const std::function<ncclResult_t(cudaStream_t)>& launch);
  void watch();
  std::shared_ptr<Work> pointToPoint(bool sending, at::Tensor tensor, int peer);

  struct Pending {
    std::shared_ptr<Work> work;  // an NcclWork: it owns `end`
    std::string op;
    int64_t bytes;
    cudaEvent_t start, end;
    std::chrono::steady_clock::time_point deadline;
    std::vector<at::Tensor> keep;  // alive until the stream is past them
  };

  ncclComm_t comm_;
  int rank_, size_, device_;
  std::string name_;
  NcclOptions options_;
  uint32_t sequence_ = 0;  // under launchMu_
  std::atomic<uint32_t> splits_{0};

  std::mutex launchMu_;  // launches and the watchdog's abort never overlap
  c10::cuda::CUDAStream stream_;  // where the collectives run
  cudaEvent_t inputsReady_ = nullptr;  // recorded on the caller's stream before each launch (under launchMu_)
  std::mutex mu_;        // guards pending_, broken_, stopping_
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  Status broken_;
  // Set (before the abort) once the communicator failed: a waiter that sees an aborted op's event
  // pass must not call it done.
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace loom::backends
