#include "backends/reduce.h"

#include <algorithm>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace loom::backends {

namespace {

template <typename T, typename Acc>
void reduceTyped(T* __restrict dst, const T* __restrict src, int64_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(static_cast<Acc>(dst[i]) + static_cast<Acc>(src[i]));
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < count; ++i)
        dst[i] = static_cast<T>(std::max(static_cast<Acc>(dst[i]), static_cast<Acc>(src[i])));
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < count; ++i)
        dst[i] = static_cast<T>(std::min(static_cast<Acc>(dst[i]), static_cast<Acc>(src[i])));
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
  RETURN_IF_ERROR(checkReducible(dtype, op));
  switch (dtype) {
    case c10::kFloat: reduceTyped<float, float>(static_cast<float*>(dst), static_cast<const float*>(src), count, op); break;
    case c10::kDouble: reduceTyped<double, double>(static_cast<double*>(dst), static_cast<const double*>(src), count, op); break;
    case c10::kHalf: reduceTyped<c10::Half, float>(static_cast<c10::Half*>(dst), static_cast<const c10::Half*>(src), count, op); break;
    case c10::kBFloat16: reduceTyped<c10::BFloat16, float>(static_cast<c10::BFloat16*>(dst), static_cast<const c10::BFloat16*>(src), count, op); break;
    case c10::kInt: reduceTyped<int32_t, int32_t>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count, op); break;
    case c10::kLong: reduceTyped<int64_t, int64_t>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, op); break;
    case c10::kChar: reduceTyped<int8_t, int8_t>(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), count, op); break;
    case c10::kByte: reduceTyped<uint8_t, uint8_t>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, op); break;
    default: break;
  }
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
