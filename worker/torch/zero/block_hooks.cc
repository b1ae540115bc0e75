#include "worker/torch/zero/block_hooks.h"

#include <torch/csrc/autograd/custom_function.h>

namespace loom::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

template <bool kBefore>
struct BlockHook : public torch::autograd::Function<BlockHook<kBefore>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t hooks, int64_t block) {
    ctx->saved_data["hooks"] = hooks;
    ctx->saved_data["block"] = block;
    return x.view_as(x);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto* hooks = reinterpret_cast<BlockBackwardHooks*>(ctx->saved_data["hooks"].toInt());
    const int block = static_cast<int>(ctx->saved_data["block"].toInt());
    if (kBefore) {
      hooks->beforeBlockBackward(block);
    } else {
      hooks->afterBlockBackward(block);
    }
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor hookAfterBackward(const at::Tensor& input, BlockBackwardHooks* hooks, int block) {
  return BlockHook<false>::apply(input, reinterpret_cast<int64_t>(hooks), static_cast<int64_t>(block));
}

at::Tensor hookBeforeBackward(const at::Tensor& output, BlockBackwardHooks* hooks, int block) {
  return BlockHook<true>::apply(output, reinterpret_cast<int64_t>(hooks), static_cast<int64_t>(block));
}

}  // namespace loom::worker
