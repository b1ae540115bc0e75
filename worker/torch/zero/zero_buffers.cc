#include "worker/torch/zero/zero_buffers.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace loom::worker {

std::vector<at::Tensor> viewsInto(const at::Tensor& flat, const std::vector<std::pair<std::string, at::Tensor>>& params,
                                  int64_t offset) {
  std::vector<at::Tensor> views;
  for (const auto& [name, p] : params) {
    views.push_back(flat.slice(0, offset, offset + p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return views;
}

std::vector<std::pair<std::string, at::Tensor>> trainableOnly(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& entry : params)
    if (entry.second.requires_grad()) out.push_back(entry);
  return out;
}

at::Tensor collectiveBuffer(backends::Communicator* comm, int64_t numel, const at::TensorOptions& options) {
  if (comm && options.device().is_cpu()) return comm->allocate({numel}, options.dtype().toScalarType());
  return at::empty({numel}, options);
}

at::ScalarType gradientWireType(const planner::DeepSpeedConfig& config, const DecoderModel& model) {
  if (model.sequenceParallel().size() == 1) return at::kFloat;
  switch (config.sequenceCommunicationType) {
    case planner::Precision::kBf16: return at::kBFloat16;
    case planner::Precision::kFp16: return at::kHalf;
    case planner::Precision::kFp32: return at::kFloat;
  }
  return at::kFloat;
}

int64_t bytesOf(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

int64_t stateBytes(const Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [name, t] : optimizer.state()) {
    if (name != "step") bytes += bytesOf(t);
  }
  return bytes;
}

double tensorParallelNormWeight(const ShardLayout& layout, int tp) {
  if (!layout.sharded()) return 1.0 / tp;
  return 1.0 / layout.replicas;
}

std::vector<double> trainableNormWeights(const DecoderModel& model) {
  std::vector<double> out;
  const int tp = model.tensorParallel().size();
  for (size_t i = 0; i < model.parameters().size(); ++i)
    if (model.parameters()[i].second.requires_grad())
      out.push_back(tensorParallelNormWeight(model.shards().layouts[i], tp));
  return out;
}

at::Tensor flatSquares(const at::Tensor& flat) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const at::Tensor v = flat.reshape({-1});
  const int64_t whole = v.numel() / kChunk * kChunk, tail = v.numel() - whole;
  // The whole chunks as the rows of one matrix: one reduction for all of them. (A split into
  // n / 2^16 tensors, 54,000 for a 3.5B model, kept the host busy for ~300 ms a step while the
  // GPU waited.)
  at::Tensor squares = at::zeros({1}, flat.options().dtype(at::kDouble));
  if (whole > 0)
    squares += at::linalg_vector_norm(v.narrow(0, 0, whole).view({-1, kChunk}), 2, at::IntArrayRef{1})
                   .to(at::kDouble)
                   .square()
                   .sum();
  if (tail > 0) squares += at::linalg_vector_norm(v.narrow(0, whole, tail)).to(at::kDouble).square();
  return squares;
}

at::Tensor weightedSquares(const std::vector<at::Tensor>& pieces, const std::vector<double>& weights,
                           const at::TensorOptions& options) {
  at::Tensor total = at::zeros({1}, options.dtype(at::kDouble));
  if (pieces.empty()) return total;
  at::Tensor norms = at::stack(at::_foreach_norm(pieces)).to(at::kDouble);
  at::Tensor w = at::tensor(at::ArrayRef<double>(weights), at::TensorOptions().dtype(at::kDouble)).to(norms.device());
  return (norms.square() * w).sum().reshape({1});
}

Status sumOver(backends::Communicator& group, at::Tensor& squares, const char* what) {
  if (group.size() == 1) return Status::ok();
  return group.allReduce(squares, backends::ReduceOp::kSum)->wait().withContext(what);
}

Status restoreTensor(const TensorMap& state, const std::string& key, at::Tensor& into, const std::string& source) {
  at::NoGradGuard noGrad;
  auto it = state.find(key);
  if (it == state.end()) return invalidArgument("{}: {} is missing", source, key);
  if (it->second.numel() != into.numel())
    return invalidArgument("{}: {} has {} elements, this rank's layout needs {}", source, key, it->second.numel(),
                           into.numel());
  into.copy_(it->second.reshape(into.sizes()));
  return Status::ok();
}

}  // namespace loom::worker
