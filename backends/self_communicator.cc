#include "backends/self_communicator.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

namespace loom::backends {

std::shared_ptr<Work> SelfCommunicator::done(const char* op, Status status) const {
  auto work = std::make_shared<Work>(fmt::format("{} on {} (1 rank)", op, name_));
  work->complete(std::move(status));
  return work;
}

std::shared_ptr<Work> SelfCommunicator::copy(const char* op, at::Tensor& output, const at::Tensor& input) const {
  if (!output.defined() || !input.defined()) return done(op, invalidArgument("{}: undefined tensor", op));
  if (output.numel() != input.numel())
    return done(op, invalidArgument("{} on {}: the output holds {} elements, the input {} (one rank: they must match)",
                                    op, name_, output.numel(), input.numel()));
  if (!output.is_same(input)) output.view(-1).copy_(input.reshape(-1));
  return done(op, Status::ok());
}

std::shared_ptr<Work> SelfCommunicator::allReduce(at::Tensor tensor, ReduceOp) {
  return done("all_reduce", tensor.defined() ? Status::ok() : invalidArgument("all_reduce: undefined tensor"));
}

std::shared_ptr<Work> SelfCommunicator::reduceScatter(at::Tensor output, at::Tensor input, ReduceOp) {
  return copy("reduce_scatter", output, input);
}

std::shared_ptr<Work> SelfCommunicator::allGather(at::Tensor output, at::Tensor input) {
  return copy("all_gather", output, input);
}

std::shared_ptr<Work> SelfCommunicator::allToAll(at::Tensor output, at::Tensor input) {
  return copy("all_to_all", output, input);
}

std::shared_ptr<Work> SelfCommunicator::allToAllV(at::Tensor output, at::Tensor input,
                                                  std::vector<int64_t> outputSplits, std::vector<int64_t> inputSplits) {
  if (outputSplits.size() != 1 || inputSplits.size() != 1)
    return done("all_to_all_v", invalidArgument("all_to_all_v on {}: splits must have 1 entry, got {} output and {} "
                                                "input",
                                                name_, outputSplits.size(), inputSplits.size()));
  if (outputSplits[0] != output.numel() || inputSplits[0] != input.numel())
    return done("all_to_all_v", invalidArgument("all_to_all_v on {}: splits add up to {} output and {} input "
                                                "elements, the tensors hold {} and {}",
                                                name_, outputSplits[0], inputSplits[0], output.numel(), input.numel()));
  return copy("all_to_all_v", output, input);
}

std::shared_ptr<Work> SelfCommunicator::broadcast(at::Tensor tensor, int root) {
  if (root != 0) return done("broadcast", invalidArgument("broadcast on {}: root {} is not a rank of it (1 rank)", name_, root));
  return done("broadcast", Status::ok());
}

std::shared_ptr<Work> SelfCommunicator::send(at::Tensor, int peer, int) {
  return done("send", invalidArgument("send on {}: peer {} is not a rank of it (1 rank, no peers)", name_, peer));
}

std::shared_ptr<Work> SelfCommunicator::recv(at::Tensor, int peer, int) {
  return done("recv", invalidArgument("recv on {}: peer {} is not a rank of it (1 rank, no peers)", name_, peer));
}

std::shared_ptr<Work> SelfCommunicator::barrier() { return done("barrier", Status::ok()); }

at::Tensor SelfCommunicator::allocate(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype));
}

StatusOr<std::shared_ptr<Communicator>> SelfCommunicator::split(const std::vector<int>& ranks, const std::string& name) {
  if (ranks.size() != 1 || ranks[0] != 0)
    return invalidArgument("split of {}: ranks must be ascending ranks of {} (0 to 0)", name_, name_);
  return std::shared_ptr<Communicator>(std::make_shared<SelfCommunicator>(name));
}

}  // namespace loom::backends
