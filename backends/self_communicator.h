#pragma once

#include <memory>
#include <string>

#include "backends/communicator.h"

namespace loom::backends {

// The communicator of a group holding one rank: a reduction, broadcast or barrier leaves the
// tensor as it is, a gather, scatter or all-to-all copies its input to its output, and every Work
// is complete when returned. A mesh axis of size 1 gets one, so the code above runs the same
// calls whatever the axis's size. Shapes are checked as the real backends check them. send and
// recv have no peer and fail. Thread-safe (it holds no state).
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
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
  at::Tensor allocate(at::IntArrayRef sizes, at::ScalarType dtype) override;
  // [0] gives this communicator again (under the new name's group, the same single rank).
  StatusOr<std::shared_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) override;

 private:
  // A completed Work: `status` for `op`.
  std::shared_ptr<Work> done(const char* op, Status status) const;
  // Copies `input` into `output` when they hold as many elements.
  std::shared_ptr<Work> copy(const char* op, at::Tensor& output, const at::Tensor& input) const;

  std::string name_;
};

}  // namespace loom::backends
