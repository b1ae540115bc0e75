#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/work.h"

namespace loom::backends {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* reduceOpName(ReduceOp op);

// Collectives over the ranks of one group. Every rank of the group must call the same
// collectives in the same order with matching shapes and dtypes (as in c10d); a mismatch is not
// detected and hangs until the timeout. Calls return at once: the operation runs in the
// background and its Work says when it is done and whether it failed. Tensors must stay alive
// and untouched until then (the Work holds a reference). Tensors must be contiguous.
// Thread-safe; operations run in the order they were issued.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // in this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", or the group's name

  // In place.
  virtual std::shared_ptr<Work> allReduce(at::Tensor tensor, ReduceOp op) = 0;
  // input: size() equal parts; output: this rank's part reduced over the group.
  virtual std::shared_ptr<Work> reduceScatter(at::Tensor output, at::Tensor input, ReduceOp op) = 0;
  // output: size() parts, part r from rank r.
  virtual std::shared_ptr<Work> allGather(at::Tensor output, at::Tensor input) = 0;
  // input and output: size() equal parts; part j of the input goes to rank j, whose output part
  // i comes from rank i.
  virtual std::shared_ptr<Work> allToAll(at::Tensor output, at::Tensor input) = 0;
  // Uneven parts, counted in elements of the flattened tensors: inputSplits[j] to rank j,
  // outputSplits[i] from rank i.
  virtual std::shared_ptr<Work> allToAllV(at::Tensor output, at::Tensor input, std::vector<int64_t> outputSplits,
                                          std::vector<int64_t> inputSplits) = 0;
  virtual std::shared_ptr<Work> broadcast(at::Tensor tensor, int root) = 0;
  virtual std::shared_ptr<Work> send(at::Tensor tensor, int peer, int tag = 0) = 0;
  virtual std::shared_ptr<Work> recv(at::Tensor tensor, int peer, int tag = 0) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // An uninitialized tensor for this communicator's collectives. On UCX, when every rank is on
  // this host, it lies in memory every rank maps (ucx/shared_heap.h): a collective whose tensors
  // all come from here (for all_gather, all_to_all and reduce_scatter: the inputs; for a
  // broadcast: the root's) reads and writes them in place, with no messages. Otherwise, and when
  // the host's shared memory is short, an ordinary host tensor; NCCL gives one on its GPU.
  virtual at::Tensor allocate(at::IntArrayRef sizes, at::ScalarType dtype) = 0;

  // A communicator over some ranks of this one (ranks of this group, ascending). Every rank of
  // this group calls it with the same list; ranks not in the list get nullptr.
  virtual StatusOr<std::shared_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) = 0;
};

}  // namespace loom::backends
