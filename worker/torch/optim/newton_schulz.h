#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "planner/deepspeed_config.h"

namespace loom::worker {

// Muon's orthogonalization, as DeepSpeed 0.19.8 computes it (runtime/zero/muon/original_muon.py):
// the same quintic coefficients (3.4445, -4.7750, 2.0315), five iterations, Frobenius
// normalisation (+ 1e-7), a tall matrix transposed first, in the same dtypes. Both forms take a
// batch of matrices in the leading dimensions.
constexpr int kNewtonSchulzSteps = 5;

// How the iteration's products are written:
// - kDeepSpeedOrder: DeepSpeed's operations one by one in its order (a scaled matrix, a product,
//   a sum: each rounded), so that a step on the CPU agrees with DeepSpeed's to the bit
//   (tests/oracles/muon_test.py);
// - kFused: each `beta * C + alpha * A B` one GEMM with its epilogue (addmm / baddbmm), a third of
//   the kernels and of the passes over the matrices; what a GPU runs (DeepSpeed compiles its
//   muon_update there, which fuses as well and so does not round as its eager code does either).
enum class NsKernels { kDeepSpeedOrder, kFused };
NsKernels newtonSchulzKernels(const at::Device& device);

// DeepSpeed's ns_compute_dtype: Gram iterates in fp16 and standard in bf16, each falling back to
// fp32 where the device lacks it (a CPU without oneDNN fp16 runs Gram in fp32).
at::ScalarType newtonSchulzDtype(planner::NsMethod method, const at::Device& device);

// The standard quintic iteration on X (n x m).
at::Tensor newtonSchulzStandard(const at::Tensor& g, NsKernels kernels, int steps = kNewtonSchulzSteps);
// The Gram form: iterates on the small square R = X X^T, restarting at iteration 2 to stay stable
// in half precision; normalises in fp32 before the cast, so that a gradient beyond fp16's range
// (a loss-scaled one) does not arrive as inf. Square matrices take the standard iteration.
at::Tensor newtonSchulzGram(const at::Tensor& g, NsKernels kernels, int steps = kNewtonSchulzSteps);

// The orthogonalized update of a matrix [rows, cols] or of a batch of them [batch, rows, cols],
// scaled by sqrt(max(1, rows / cols)) and returned in the update's dtype: each matrix at once,
// or with `headWidth` > 0 each block of headWidth rows on its own (per-head Muon), each block
// scaled by its own aspect ratio. `kernels` defaults to newtonSchulzKernels(update.device()).
at::Tensor orthogonalize(const at::Tensor& update, planner::NsMethod method, int64_t headWidth = 0);
at::Tensor orthogonalize(const at::Tensor& update, planner::NsMethod method, int64_t headWidth, NsKernels kernels);

}  // namespace loom::worker
