#include "backends/reduce.h"

#include <algorithm>

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

}  // namespace loom::backends
