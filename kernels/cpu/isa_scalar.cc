// The portable kernels (one lane, baseline x86-64 or any other processor): the fallback where
// cpuid finds neither AVX2 nor AVX-512F, and a third path for the conformance tests.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/cpu_kernels.h"

namespace loom::kernels::cpu::scalar {
namespace {

constexpr const char* kIsaName = "scalar";
#include "kernels/cpu/vec_scalar.h"
// The kernels, over the Vec above:
#include "kernels/cpu/kernels_impl.h"

}  // namespace
}  // namespace loom::kernels::cpu::scalar

namespace loom::kernels::cpu {
const IsaKernels& scalarKernels() { return scalar::kKernels; }
}  // namespace loom::kernels::cpu
