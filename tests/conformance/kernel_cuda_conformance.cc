#include "tests/conformance/kernel_cuda_conformance.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/loader.h"

namespace loom::testing {

const loom_kernel_table& cudaPlugin() {
  static const loom_kernel_table* table = [] {
    auto opened = kernels::openPlugin(LOOM_CUDA_PLUGIN_PATH, nullptr);
    if (!opened.isOk()) {
      std::fprintf(stderr, "%s\n", opened.status().message().c_str());
      std::abort();
    }
    return *opened;
  }();
  return *table;
}

StreamPass::StreamPass(bool pooled) : label_(pooled ? "on a pool stream" : "on the default stream") {
  if (!pooled) return;
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  guard_.emplace(stream);
  stream_ = stream.stream();
}

at::Tensor onCuda(const at::Tensor& t) { return t.to(at::kCUDA); }

}  // namespace loom::testing
