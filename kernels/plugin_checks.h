#pragma once

// What every kernel plugin's C entry points share: the last error's text (the ABI's last_error)
// and the argument checks run before anything is written or enqueued. Header-only, and of
// internal linkage on purpose: a plugin links nothing of Loom's, and two plugins loaded into one
// process must not end up sharing one error string through symbol interposition. Each plugin
// includes it from its one translation unit of entry points.

#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/loom_kernel_abi.h"

namespace loom::kernels {
namespace {

thread_local std::string tLastError;

// Records `message` for last_error and returns `status`.
int fail(int status, std::string message) {
  tLastError = std::move(message);
  return status;
}

const char* lastError() { return tLastError.c_str(); }

#define LOOM_CHECK(expr)                             \
  do {                                               \
    const int loom_rc_ = (expr);                     \
    if (loom_rc_ != LOOM_KERNEL_OK) return loom_rc_; \
  } while (0)

int checkDtype(loom_dtype dtype, const char* what) {
  if (dtype != LOOM_DTYPE_F32 && dtype != LOOM_DTYPE_BF16)
    return fail(LOOM_KERNEL_UNSUPPORTED,
                std::string(what) + ": dtype " + std::to_string(dtype) + " is neither fp32 nor bf16");
  return LOOM_KERNEL_OK;
}

int checkSizes(std::initializer_list<int64_t> sizes, const char* what) {
  for (int64_t s : sizes)
    if (s < 0) return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": a negative size");
  return LOOM_KERNEL_OK;
}

// With `needed` (there is work to do), none of `pointers` may be NULL.
int checkPointers(bool needed, std::initializer_list<const void*> pointers, const char* what) {
  if (!needed) return LOOM_KERNEL_OK;
  for (const void* p : pointers)
    if (!p) return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": a required tensor is NULL");
  return LOOM_KERNEL_OK;
}

// rope_kv_write's arguments (loom_kernel_abi.h), as every plugin checks them.
int checkRopeKvWrite(loom_dtype dtype, std::initializer_list<const void*> tensors, const void* qNorm,
                     const void* kNorm, int64_t qStride, int64_t kvStride, int64_t tokens, int64_t heads,
                     int64_t kvHeads, int64_t dim) {
  const char* what = "rope_kv_write";
  LOOM_CHECK(checkDtype(dtype, what));
  LOOM_CHECK(checkSizes({qStride, kvStride, tokens, heads, kvHeads, dim}, what));
  const bool work = tokens > 0 && (heads > 0 || kvHeads > 0) && dim > 0;
  LOOM_CHECK(checkPointers(work, tensors, what));
  if (dim % 2 != 0)
    return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": head_dim must be even, got " + std::to_string(dim));
  if (qStride < heads * dim || kvStride < kvHeads * dim)
    return fail(LOOM_KERNEL_INVALID_ARGUMENT,
                std::string(what) + ": token rows overlap (q_stride " + std::to_string(qStride) + " for " +
                    std::to_string(heads) + " heads of " + std::to_string(dim) + ", kv_stride " +
                    std::to_string(kvStride) + " for " + std::to_string(kvHeads) + ")");
  if ((qNorm == nullptr) != (kNorm == nullptr))
    return fail(LOOM_KERNEL_INVALID_ARGUMENT, std::string(what) + ": q_norm and k_norm go together (both or neither)");
  return LOOM_KERNEL_OK;
}

}  // namespace
}  // namespace loom::kernels
