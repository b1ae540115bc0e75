// The kernels for AVX2 + FMA. Every function defined between the target push and pop below carries that
// target attribute (the pragma is GCC's and clang's spelling of it for a whole region), so the
// rest of the plugin stays baseline x86-64: the build machine's flags decide nothing, and
// plugin.cc calls in here only after cpuid says this processor has AVX2 + FMA.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/cpu_kernels.h"

// GCC 12 flags its own intrinsic headers (the undefined vectors of _mm512_undefined_ps and its
// kin) when they are inlined under a target pragma.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace loom::kernels::cpu::avx2 {
namespace {

constexpr const char* kIsaName = "avx2";
#include "kernels/cpu/vec_avx2.h"
// The kernels, over the Vec above:
#include "kernels/cpu/kernels_impl.h"

}  // namespace
}  // namespace loom::kernels::cpu::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace loom::kernels::cpu {
const IsaKernels& avx2Kernels() { return avx2::kKernels; }
}  // namespace loom::kernels::cpu
