#pragma once

#include <ATen/core/Tensor.h>

namespace loom::worker {

// Points in a block's backward where ZeRO acts. Autograd runs a block's backward between the
// moment the gradient reaches the block's output and the moment it leaves through its input;
// the parameters' gradients are accumulated on the way (before the input's gradient is passed
// on, as their accumulation nodes run first), so "after" sees them complete.
class BlockBackwardHooks {
 public:
  virtual ~BlockBackwardHooks() = default;
  virtual void beforeBlockBackward(int block) {}
  virtual void afterBlockBackward(int block) {}
};

// Identity on a block's input (which must require grad); hooks->afterBlockBackward(block) runs
// when its gradient is computed.
at::Tensor hookAfterBackward(const at::Tensor& input, BlockBackwardHooks* hooks, int block);
// Identity on a block's output; hooks->beforeBlockBackward(block) runs when its gradient arrives.
at::Tensor hookBeforeBackward(const at::Tensor& output, BlockBackwardHooks* hooks, int block);

}  // namespace loom::worker
