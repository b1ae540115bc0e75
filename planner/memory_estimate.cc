#include "planner/memory_estimate.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/human_bytes.h"
#include "common/shape.h"

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
  const double stateBytes = 4 * s.optimizerStates;
  const int64_t ep = std::max(1, s.expertParallel);
  const int64_t dp = std::max(1, s.dataParallel), edp = std::max<int64_t>(1, dp / ep);

  // Elements a rank holds, dense and expert apart (they are partitioned over different groups).
  struct Held {
    int64_t all = 0, trainable = 0, persistent = 0;
  } dense, expert;
  int64_t largestParameter = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const int64_t n = numelOf(layouts[i].localShape);
    Held& h = parameters[i].expert >= 0 ? expert : dense;
    h.all += n;
    if (parameters[i].trainable) h.trainable += n;
    if (n <= s.persistenceThreshold) h.persistent += n;
    largestParameter = std::max(largestParameter, n);
  }
  // Every expert has the same shapes, so each expert-parallel rank holds exactly 1/ep of them.
  expert.all /= ep;
  expert.trainable /= ep;
  expert.persistent /= ep;
  // ZeRO pads each partition; the rounding is below a few elements per parameter.
  auto partitioned = [](int64_t n, int64_t group) { return (n + group - 1) / group; };
  const int64_t held = dense.all + expert.all, trainable = dense.trainable + expert.trainable;

  MemoryEstimate m;
  if (s.zeroStage >= 3) {
    const int64_t parts = weightBytes * (partitioned(dense.all - dense.persistent, dp) +
                                         partitioned(expert.all - expert.persistent, edp));
    (s.offloadParameters ? m.hostParameters : m.parameters) = parts;
    m.parameters += weightBytes * (dense.persistent + expert.persistent +
                                   std::min(held, std::max(s.prefetchBucketElements, largestParameter)));
  } else {
    m.parameters = weightBytes * held;
  }
  m.gradients = weightBytes * (s.zeroStage >= 2 ? partitioned(dense.trainable, dp) + partitioned(expert.trainable, edp) +
                                                      std::min(trainable, s.reduceBucketElements)
                                                : trainable);
  const int64_t optimizerBytes = static_cast<int64_t>(
      (static_cast<double>(masterBytes) + stateBytes) *
      static_cast<double>(s.zeroStage >= 1 ? partitioned(dense.trainable, dp) + partitioned(expert.trainable, edp)
                                           : trainable));
  (s.offloadOptimizer ? m.hostOptimizer : m.optimizer) = optimizerBytes;
  if (!s.training) m.gradients = m.optimizer = m.hostOptimizer = 0;

  const int64_t tokens = s.microBatch * s.sequenceLength / std::max(1, s.sequenceParallel);
  const int64_t tp = std::max(1, s.tensorParallel);
  // Korthikanti et al.: s*b*h*(10 + 24/t) bytes per layer in 16-bit (the 5*a*s/h term is the
  // attention matrix, which memory-efficient attention never stores).
  const int64_t perLayer = c.hiddenSize * tokens * (10 + 24 / tp);
  const int64_t checkpointed = std::min(s.checkpointedLayers, c.numLayers);
  const int64_t kept = s.checkpointsOnHost ? 0 : weightBytes * c.hiddenSize * tokens;  // the layer's input
  m.activations = perLayer * (c.numLayers - checkpointed) + (checkpointed > 0 ? checkpointed * kept + perLayer : 0) +
                  2 * 4 * tokens * (c.vocabSize / tp);
  return m;
}

Status checkFits(const MemoryEstimate& m, int64_t deviceBytes) {
  if (m.total() <= deviceBytes) return Status::ok();
  return Status(StatusCode::kInvalidArgument,
                fmt::format("estimated {} per rank is {} above the device's {}; the largest term is {}",
                            humanBytes(m.total()), humanBytes(m.total() - deviceBytes), humanBytes(deviceBytes),
                            m.largestTerm()));
}

}  // namespace loom::planner
