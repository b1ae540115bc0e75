#pragma once

// Shared by the CUDA kernel conformance tests ([gpu]): the CUDA plugin under test (loaded through
// the loader from LOOM_CUDA_PLUGIN_PATH, the build's) and the streams a test runs it on. The
// reference is reference_ops.h run by libtorch on the same CUDA tensors.

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <string>

#include "kernels/loom_kernel_abi.h"
#include "tests/conformance/kernel_compare.h"

namespace loom::testing {

const loom_kernel_table& cudaPlugin();

// The stream one pass of a test runs on: the legacy default stream (the plugin gets NULL) or a
// stream of libtorch's pool, made current for the reference's ops while its handle goes to the
// plugin's. The plugin and the reference then queue on one stream, so no pass synchronizes
// between them, and an op that ignored the stream it was given would race and fail.
class StreamPass {
 public:
  explicit StreamPass(bool pooled);
  void* stream() const { return stream_; }
  const std::string& label() const { return label_; }

 private:
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
  void* stream_ = nullptr;
  std::string label_;
};
constexpr bool kPooledStream[] = {false, true};

// A copy on the current CUDA device.
at::Tensor onCuda(const at::Tensor& t);

}  // namespace loom::testing
