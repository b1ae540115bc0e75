#include "planner/memory_estimate.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/human_bytes.h"

namespace loom::planner {

std::string MemoryEstimate::largestTerm() const {
  std::pair<int64_t, const char*> terms[] = {
      {parameters, "parameters"}, {gradients, "gradients"}, {optimizer, "optimizer state"}, {activations, "activations"}};
  auto largest = *std::max_element(std::begin(terms), std::end(terms));
  return fmt::format("{} ({})", largest.second, humanBytes(largest.first));
}

MemoryEstimate estimateMemory(const ModelConfig& c, const std::vector<ParameterInfo>& parameters,
                              const std::vector<TpLayout>& layouts, const TrainingShape& s) {
  const int64_t weightBytes = s.precision == Precision::kFp32 ? 4 : 2;
  const int64_t masterBytes = s.precision == Precision::kFp32 ? 0 : 4;
  const int64_t stateBytes = 4 * static_cast<int64_t>(s.optimizerStates);
  const int64_t dp = std::max(1, s.dataParallel);

  int64_t local = 0, persistent = 0, largestParameter = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : layouts[i].localShape) n *= d;
    local += n;
    largestParameter = std::max(largestParameter, n);
    if (n <= s.persistenceThreshold) persistent += n;
  }
  // ZeRO pads each partition; the rounding is below a few elements per parameter.
  auto partitioned = [&](int64_t n) { return (n + dp - 1) / dp; };

  MemoryEstimate m;
  m.parameters = weightBytes * (s.zeroStage >= 3 ? partitioned(local - persistent) + persistent +
                                                       std::min(local, std::max(s.prefetchBucketElements, largestParameter))
                                                 : local);
  m.gradients = weightBytes * (s.zeroStage >= 2 ? partitioned(local) + std::min(local, s.reduceBucketElements) : local);
  const int64_t optimizerBytes = (masterBytes + stateBytes) * (s.zeroStage >= 1 ? partitioned(local) : local);
  (s.offloadOptimizer ? m.hostOptimizer : m.optimizer) = optimizerBytes;

  const int64_t tokens = s.microBatch * s.sequenceLength / std::max(1, s.sequenceParallel);
  const int64_t tp = std::max(1, s.tensorParallel);
  // Korthikanti et al.: s*b*h*(10 + 24/t) bytes per layer in 16-bit (the 5*a*s/h term is the
  // attention matrix, which memory-efficient attention never stores).
  m.activations = c.hiddenSize * tokens * c.numLayers * (10 + 24 / tp) + 2 * 4 * tokens * (c.vocabSize / tp);
  return m;
}

Status checkFits(const MemoryEstimate& m, int64_t deviceBytes) {
  if (m.total() <= deviceBytes) return Status::ok();
  return Status(StatusCode::kResourceExhausted,
                fmt::format("estimated {} per rank is {} above the device's {}; the largest term is {}",
                            humanBytes(m.total()), humanBytes(m.total() - deviceBytes), humanBytes(deviceBytes),
                            m.largestTerm()));
}

}  // namespace loom::planner
