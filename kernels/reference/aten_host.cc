// atenKernelHost(). at::parallel_for is a header template whose OpenMP backend is a
// `#pragma omp parallel` compiled into the caller: without -fopenmp it silently runs on one thread.
// This file alone is compiled with -fopenmp and calls into the wheel's own libgomp (the runtime
// libtorch already uses), see kernels/CMakeLists.txt.
#include <ATen/Parallel.h>

#include "kernels/reference/reference_table.h"

#ifndef _OPENMP
#error "aten_host.cc must be compiled with -fopenmp, or at::parallel_for runs on one thread"
#endif

namespace loom::kernels::reference {
namespace {

void atenParallelFor(void* /*hostCtx*/, int64_t n, int64_t grain, loom_range_fn fn, void* fnCtx) {
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { fn(fnCtx, begin, end); });
}

}  // namespace

loom_kernel_host atenKernelHost() {
  return {.struct_size = sizeof(loom_kernel_host),
          .num_threads = at::get_num_threads(),
          .isa = nullptr,
          .parallel_for = atenParallelFor,
          .host_ctx = nullptr};
}

}  // namespace loom::kernels::reference
