#include "planner/zero_partition.h"

#include <algorithm>

namespace loom::planner {

FlatPartition partitionFlat(const std::vector<int64_t>& numels, int dp, int alignment) {
  FlatPartition out;
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  const int64_t unit = static_cast<int64_t>(alignment) * dp;
  out.flatNumel = (total + unit - 1) / unit * unit;
  out.padding = out.flatNumel - total;
  out.partitionNumel = out.flatNumel / dp;
  out.fragments.resize(dp);
  int64_t start = 0;  // of the current parameter in the flat buffer
  for (size_t p = 0; p < numels.size(); ++p) {
    const int64_t end = start + numels[p];
    // Every partition the parameter overlaps gets the overlapping piece.
    for (int64_t r = start / std::max<int64_t>(1, out.partitionNumel); r < dp && r * out.partitionNumel < end; ++r) {
      const int64_t lo = std::max(start, r * out.partitionNumel), hi = std::min(end, (r + 1) * out.partitionNumel);
      if (hi <= lo) continue;
      out.fragments[r].push_back(ZeroFragment{.parameter = static_cast<int>(p), .parameterOffset = lo - start,
                                              .length = hi - lo, .partitionOffset = lo - r * out.partitionNumel});
    }
    start = end;
  }
  return out;
}

std::vector<ParameterPartition> partitionPerParameter(const std::vector<int64_t>& numels, int dp,
                                                      int64_t persistenceThreshold, int64_t modelPersistenceThreshold) {
  std::vector<ParameterPartition> out;
  out.reserve(numels.size());
  int64_t persistentTotal = 0;
  for (int64_t n : numels) {
    if (n <= persistenceThreshold && persistentTotal + n <= modelPersistenceThreshold) {
      persistentTotal += n;
      out.push_back({.persistent = true, .partitionNumel = n});
    } else {
      out.push_back({.persistent = false, .partitionNumel = (n + dp - 1) / dp});
    }
  }
  return out;
}

}  // namespace loom::planner
