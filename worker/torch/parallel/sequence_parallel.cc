#include "worker/torch/parallel/sequence_parallel.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "worker/torch/parallel/autograd_communicator.h"
#include "worker/torch/parallel/throw_if_error.h"

namespace loom::worker {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// parts [sp, ...] (any strides), part j for rank j -> [sp, ...] contiguous, part i from rank i.
// Host buffers come from the communicator, so that ranks on one host exchange in shared memory.
at::Tensor exchange(const at::Tensor& parts, backends::Communicator& sp) {
  // Named for the step profiler (train.profile_step), which lists it beside the ATen operators.
  RECORD_FUNCTION("loom::sequence_parallel_all_to_all", std::vector<c10::IValue>());
  auto buffer = [&] {
    return parts.is_cpu() ? sp.allocate(parts.sizes(), parts.scalar_type()) : at::empty(parts.sizes(), parts.options());
  };
  at::Tensor input = buffer(), output = buffer();
  input.copy_(parts);
  throwIfError(sp.allToAll(output, input)->wait().withContext("sequence-parallel all-to-all"));
  return output;
}

at::Tensor gather(const at::Tensor& x, backends::Communicator& sp) {
  const int64_t b = x.size(0), s = x.size(1), n = x.size(2), h = x.size(3), d = x.size(4);
  // Sent by head group, received by sequence chunk.
  at::Tensor received = exchange(x.permute({2, 0, 1, 3, 4}), sp);  // [sp, B, s, h, D]
  return received.permute({1, 0, 2, 3, 4}).reshape({b, n * s, h, d});
}

at::Tensor scatter(const at::Tensor& x, backends::Communicator& sp) {
  const int64_t b = x.size(0), n = sp.size(), s = x.size(1) / n, h = x.size(2), d = x.size(3);
  // Sent by sequence chunk, received by head group.
  at::Tensor received = exchange(x.view({b, n, s, h, d}).permute({1, 0, 2, 3, 4}), sp);  // [sp, B, s, h, D]
  return received.permute({1, 2, 0, 3, 4});
}

struct GatherSequence : public torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, backends::Communicator* sp) {
    keepCommunicator(ctx, *sp);
    return gather(x, *sp);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {scatter(grads[0], communicatorOf(ctx)), at::Tensor()};
  }
};

struct ScatterSequence : public torch::autograd::Function<ScatterSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, backends::Communicator* sp) {
    keepCommunicator(ctx, *sp);
    return scatter(x, *sp);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {gather(grads[0], communicatorOf(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor gatherSequence(const at::Tensor& x, backends::Communicator& sp) {
  if (sp.size() == 1) return x.squeeze(2);
  return GatherSequence::apply(x, &sp);
}

at::Tensor scatterSequence(const at::Tensor& x, backends::Communicator& sp) {
  if (sp.size() == 1) return x.unsqueeze(2);
  return ScatterSequence::apply(x, &sp);
}

at::Tensor kvHeadsForSequenceParallel(const at::Tensor& k, int sp) {
  const int64_t heads = k.size(2);
  if (heads % sp == 0) return k;
  return k.repeat_interleave(sp / heads, /*dim=*/2);
}

}  // namespace loom::worker
