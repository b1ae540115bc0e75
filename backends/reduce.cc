#include "backends/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace loom::backends {

namespace {

// `out` may alias `a` (in-place reduction), so only `b` is restrict.
template <typename T, typename Acc>
void reduceTyped(T* out, const T* a, const T* __restrict b, int64_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<Acc>(a[i]) + static_cast<Acc>(b[i]));
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < count; ++i)
        out[i] = static_cast<T>(std::max(static_cast<Acc>(a[i]), static_cast<Acc>(b[i])));
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < count; ++i)
        out[i] = static_cast<T>(std::min(static_cast<Acc>(a[i]), static_cast<Acc>(b[i])));
      return;
  }
}

template <typename T, typename Acc>
void divideTyped(T* data, int64_t count, int n) {
  const Acc divisor = static_cast<Acc>(n);
  for (int64_t i = 0; i < count; ++i) data[i] = static_cast<T>(static_cast<Acc>(data[i]) / divisor);
}

bool isFloating(c10::ScalarType t) {
  return t == c10::kFloat || t == c10::kDouble || t == c10::kHalf || t == c10::kBFloat16;
}

}  // namespace

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

Status checkReducible(c10::ScalarType dtype, ReduceOp op) {
  switch (dtype) {
    case c10::kFloat:
    case c10::kDouble:
    case c10::kHalf:
    case c10::kBFloat16:
    case c10::kInt:
    case c10::kLong:
    case c10::kChar:
    case c10::kByte:
      break;
    default:
      return invalidArgument("{} cannot be reduced", c10::toString(dtype));
  }
  if (op == ReduceOp::kAvg && !isFloating(dtype))
    return invalidArgument("avg is for floating-point tensors; {} needs sum and a division of your own",
                           c10::toString(dtype));
  return Status::ok();
}

Status reduceInto(void* dst, const void* src, int64_t count, c10::ScalarType dtype, ReduceOp op) {
  return combine(dst, dst, src, count, dtype, op);
}

Status combine(void* out, const void* a, const void* b, int64_t count, c10::ScalarType dtype, ReduceOp op) {
  RETURN_IF_ERROR(checkReducible(dtype, op));
#define LOOM_COMBINE(T, Acc) \
  reduceTyped<T, Acc>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), count, op)
  switch (dtype) {
    case c10::kFloat: LOOM_COMBINE(float, float); break;
    case c10::kDouble: LOOM_COMBINE(double, double); break;
    case c10::kHalf: LOOM_COMBINE(c10::Half, float); break;
    case c10::kBFloat16: LOOM_COMBINE(c10::BFloat16, float); break;
    case c10::kInt: LOOM_COMBINE(int32_t, int32_t); break;
    case c10::kLong: LOOM_COMBINE(int64_t, int64_t); break;
    case c10::kChar: LOOM_COMBINE(int8_t, int8_t); break;
    case c10::kByte: LOOM_COMBINE(uint8_t, uint8_t); break;
    default: break;
  }
#undef LOOM_COMBINE
  return Status::ok();
}

Status finishAverage(void* data, int64_t count, c10::ScalarType dtype, int n) {
  switch (dtype) {
    case c10::kFloat: divideTyped<float, float>(static_cast<float*>(data), count, n); break;
    case c10::kDouble: divideTyped<double, double>(static_cast<double*>(data), count, n); break;
    case c10::kHalf: divideTyped<c10::Half, float>(static_cast<c10::Half*>(data), count, n); break;
    case c10::kBFloat16: divideTyped<c10::BFloat16, float>(static_cast<c10::BFloat16*>(data), count, n); break;
    default: return invalidArgument("avg is for floating-point tensors, not {}", c10::toString(dtype));
  }
  return Status::ok();
}

namespace {

// Streaming copy without the fence: the caller fences once after many.
void copyUnfenced(char* d, const char* s, size_t bytes, bool streaming) {
#if defined(__x86_64__)
  if (streaming && bytes >= 256) {
    const size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  (void)streaming;
  std::memcpy(d, s, bytes);
}

void fence(bool streaming) {
#if defined(__x86_64__)
  if (streaming) _mm_sfence();  // streaming stores are not ordered by a later release store
#endif
  (void)streaming;
}

// float sum (or average) of every source, in order, stored to every destination: one pass, each
// source read once, each destination written once. Scalar and vector steps round alike (IEEE
// adds and divides), so where the vectors start does not change a bit.
float sumAt(const std::vector<const char*>& sources, int64_t i, float divisor) {
  float x = reinterpret_cast<const float*>(sources[0])[i] + reinterpret_cast<const float*>(sources[1])[i];
  for (size_t q = 2; q < sources.size(); ++q) x += reinterpret_cast<const float*>(sources[q])[i];
  return divisor == 1.0f ? x : x / divisor;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void sumFloatAvx2(const std::vector<const char*>& sources,
                                                  const std::vector<char*>& destinations, int64_t count,
                                                  float divisor, bool streaming) {
  auto dst = [&](size_t d) { return reinterpret_cast<float*>(destinations[d]); };
  auto src = [&](size_t q) { return reinterpret_cast<const float*>(sources[q]); };
  // Streaming stores need 32-byte alignment: scalar steps up to it, when every destination gets
  // there at the same element.
  int64_t i = 0;
  const uintptr_t misaligned = reinterpret_cast<uintptr_t>(dst(0)) % 32;
  for (size_t d = 1; d < destinations.size(); ++d)
    if (reinterpret_cast<uintptr_t>(dst(d)) % 32 != misaligned) streaming = false;
  if (streaming && misaligned % sizeof(float) != 0) streaming = false;
  if (streaming) {
    for (; i < count && reinterpret_cast<uintptr_t>(dst(0) + i) % 32 != 0; ++i) {
      const float x = sumAt(sources, i, divisor);
      for (size_t d = 0; d < destinations.size(); ++d) dst(d)[i] = x;
    }
  }
  const __m256 div = _mm256_set1_ps(divisor);
  for (; i + 8 <= count; i += 8) {
    __m256 x = _mm256_add_ps(_mm256_loadu_ps(src(0) + i), _mm256_loadu_ps(src(1) + i));
    for (size_t q = 2; q < sources.size(); ++q) x = _mm256_add_ps(x, _mm256_loadu_ps(src(q) + i));
    if (divisor != 1.0f) x = _mm256_div_ps(x, div);
    if (streaming) {
      for (size_t d = 0; d < destinations.size(); ++d) _mm256_stream_ps(dst(d) + i, x);
    } else {
      for (size_t d = 0; d < destinations.size(); ++d) _mm256_storeu_ps(dst(d) + i, x);
    }
  }
  for (; i < count; ++i) {
    const float x = sumAt(sources, i, divisor);
    for (size_t d = 0; d < destinations.size(); ++d) dst(d)[i] = x;
  }
}
#endif

}  // namespace

void copyBytes(void* dst, const void* src, size_t bytes, bool streaming) {
  copyUnfenced(static_cast<char*>(dst), static_cast<const char*>(src), bytes, streaming);
  fence(streaming);
}

Status reduceToAll(const std::vector<const char*>& sources, const std::vector<char*>& destinations, int64_t count,
                   c10::ScalarType dtype, ReduceOp op, bool streaming) {
  RETURN_IF_ERROR(checkReducible(dtype, op));
  if (sources.size() < 2) return invalidArgument("a reduction needs two sources or more, got {}", sources.size());
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && dtype == c10::kFloat && (op == ReduceOp::kSum || op == ReduceOp::kAvg)) {
    sumFloatAvx2(sources, destinations, count,
                 op == ReduceOp::kAvg ? static_cast<float>(sources.size()) : 1.0f, streaming);
    fence(streaming);
    return Status::ok();
  }
#endif
  // Any dtype and op: a chunk at a time into a buffer that stays in the cache, then out.
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  constexpr int64_t kChunkBytes = 32 * 1024;
  thread_local std::vector<char> partial(kChunkBytes);
  const int64_t chunk = kChunkBytes / elem;
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t len = std::min(chunk, count - off), at = off * elem;
    RETURN_IF_ERROR(combine(partial.data(), sources[0] + at, sources[1] + at, len, dtype, op));
    for (size_t q = 2; q < sources.size(); ++q) RETURN_IF_ERROR(reduceInto(partial.data(), sources[q] + at, len, dtype, op));
    if (op == ReduceOp::kAvg) RETURN_IF_ERROR(finishAverage(partial.data(), len, dtype, static_cast<int>(sources.size())));
    for (char* d : destinations) copyUnfenced(d + at, partial.data(), len * elem, streaming);
  }
  fence(streaming);
  return Status::ok();
}

}  // namespace loom::backends
