#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "backends/communicator.h"
#include "common/status.h"

namespace loom::backends {

// dst[i] = op(dst[i], src[i]) for `count` elements of `dtype`. Half-precision types are reduced
// in float and rounded once per step. kAvg reduces as a sum; finishAverage() divides at the end.
// InvalidArgument for a dtype this backend does not reduce (complex, bool) or kAvg on integers.
Status reduceInto(void* dst, const void* src, int64_t count, c10::ScalarType dtype, ReduceOp op);
// out[i] = op(a[i], b[i]); `out` may be `a`.
Status combine(void* out, const void* a, const void* b, int64_t count, c10::ScalarType dtype, ReduceOp op);
Status finishAverage(void* data, int64_t count, c10::ScalarType dtype, int groupSize);
Status checkReducible(c10::ScalarType dtype, ReduceOp op);

}  // namespace loom::backends
