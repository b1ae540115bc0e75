#include "worker/torch/parallel/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/torch/parallel/autograd_communicator.h"
#include "worker/torch/parallel/throw_if_error.h"

namespace loom::worker {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

at::Tensor summed(const at::Tensor& x, backends::Communicator& tp, const char* what) {
  at::Tensor out = x.contiguous();
  if (out.is_same(x)) out = x.clone();
  throwIfError(tp.allReduce(out, backends::ReduceOp::kSum)->wait().withContext(what));
  return out;
}

struct CopyToTensorParallel : public torch::autograd::Function<CopyToTensorParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, backends::Communicator* tp) {
    keepCommunicator(ctx, *tp);
    return x.view_as(x);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {summed(grads[0], communicatorOf(ctx), "tensor-parallel gradient all-reduce"), at::Tensor()};
  }
};

struct ReduceFromTensorParallel : public torch::autograd::Function<ReduceFromTensorParallel> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, backends::Communicator* tp) {
    return summed(x, *tp, "tensor-parallel all-reduce");
  }
  static tensor_list backward(AutogradContext*, tensor_list grads) { return {grads[0], at::Tensor()}; }
};

}  // namespace

at::Tensor copyToTensorParallel(const at::Tensor& x, backends::Communicator& tp) {
  if (tp.size() == 1) return x;
  return CopyToTensorParallel::apply(x, &tp);
}

at::Tensor reduceFromTensorParallel(const at::Tensor& x, backends::Communicator& tp) {
  if (tp.size() == 1) return x;
  return ReduceFromTensorParallel::apply(x, &tp);
}

void sumGradientOverGroup(at::Tensor& parameter, backends::Communicator& tp) {
  if (!parameter.defined() || tp.size() == 1) return;
  backends::Communicator* group = &tp;
  parameter.register_hook([group](const at::Tensor& grad) {
    return summed(grad, *group, "tensor-parallel gradient all-reduce");
  });
}

void sumGradientOverKvReplicas(at::Tensor& parameter, const ShardLayout& layout, backends::Communicator& tp) {
  if (!parameter.defined() || layout.replicas <= 1) return;
  backends::Communicator* group = &tp;
  parameter.register_hook([group, layout](const at::Tensor& grad) {
    // Every rank's gradient in its head's place of the whole projection, summed: each head then
    // holds the sum over the ranks that share it.
    std::vector<int64_t> sizes = grad.sizes().vec();
    const int64_t piece = sizes[layout.dim];
    sizes[layout.dim] = piece * layout.parts;
    at::Tensor whole = at::zeros(sizes, grad.options());
    whole.narrow(layout.dim, layout.index * piece, piece).copy_(grad);
    throwIfError(group->allReduce(whole, backends::ReduceOp::kSum)->wait().withContext(
        "tensor-parallel KV-head gradient all-reduce"));
    return whole.narrow(layout.dim, layout.index * piece, piece).contiguous();
  });
}

at::Tensor vocabParallelEmbedding(const at::Tensor& table, const at::Tensor& ids, int64_t vocabStart,
                                  backends::Communicator& tp) {
  if (tp.size() == 1) return at::embedding(table, ids);
  const int64_t rows = table.size(0);
  // An id no rank holds would look up zeros everywhere instead of failing as at::embedding does.
  const int64_t largest = ids.max().item<int64_t>(), vocab = rows * tp.size();
  TORCH_CHECK(ids.min().item<int64_t>() >= 0 && largest < vocab, "token id ", largest,
              " is outside the model's vocabulary of ", vocab);
  at::Tensor local = ids - vocabStart;
  at::Tensor outside = (local < 0).logical_or(local >= rows);
  at::Tensor looked = at::embedding(table, local.masked_fill(outside, 0));
  // Zeros where the id is another rank's: their gradient is zero too, so this rank's rows get
  // the gradients of its own ids only.
  looked = looked.masked_fill(outside.unsqueeze(-1), 0);
  return reduceFromTensorParallel(looked, tp);
}

}  // namespace loom::worker
