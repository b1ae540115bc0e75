#pragma once

#include <cstdint>
#include <vector>

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
// memcpy; with `streaming` the stores bypass the cache, for data far larger than it that the
// writer will not read back soon: the destination is then not read before it is written. The
// stores are visible to a core that sees a release store made after this returns.
void copyBytes(void* dst, const void* src, size_t bytes, bool streaming);
// destinations[d][i] = op(sources[0][i], sources[1][i], ...) in that order (kAvg: divided by the
// number of sources), for `count` elements, in one pass over memory: what an all-reduce over
// memory every rank maps needs. `streaming` as in copyBytes. Destinations may be sources.
Status reduceToAll(const std::vector<const char*>& sources, const std::vector<char*>& destinations, int64_t count,
                   c10::ScalarType dtype, ReduceOp op, bool streaming);

}  // namespace loom::backends
