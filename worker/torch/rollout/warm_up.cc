#include "worker/torch/rollout/warm_up.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>

#include "worker/torch/model/model_setup.h"
#include "worker/torch/rollout/sampler.h"

namespace loom::worker {

namespace {

// Half of the step's sequences decode one token, the other half compute prompt chunks that
// together fill the token budget: the scheduler's second step of a full batch looks so.
StepBatch scratchStep(const rollout::SchedulerLimits& limits, int64_t scratchBlock, int64_t slidingWindow,
                      at::Device device) {
  const int64_t budget = limits.maxNumBatchedTokens, maxSeqs = limits.maxNumSeqs;
  const int64_t decodes = std::min(maxSeqs / 2, budget / 2);
  const int64_t chunks = std::max<int64_t>(1, maxSeqs - decodes);
  const int64_t chunk = std::clamp<int64_t>((budget - decodes + chunks - 1) / chunks, 1, limits.maxModelLen);
  const int64_t width = (chunk + limits.blockSize - 1) / limits.blockSize;

  std::vector<int64_t> positions, slots, logitRows, contextLens, queryStarts{0};
  auto addSequence = [&](int64_t count) {
    // Every position's key lands in the scratch block (later ones overwrite earlier ones): the
    // values are garbage but finite, and no sequence reads them.
    for (int64_t p = 0; p < count; ++p) {
      positions.push_back(p);
      slots.push_back(scratchBlock * limits.blockSize + p % limits.blockSize);
    }
    logitRows.push_back(static_cast<int64_t>(positions.size()) - 1);
    contextLens.push_back(count);
    queryStarts.push_back(static_cast<int64_t>(positions.size()));
  };
  for (int64_t i = 0; i < decodes; ++i) addSequence(1);
  for (int64_t left = budget - decodes; left > 0 && int64_t(contextLens.size()) < maxSeqs; left -= chunk)
    addSequence(std::min(chunk, left));

  const auto longs = at::TensorOptions().dtype(at::kLong);
  auto onDevice = [&](const std::vector<int64_t>& v) { return at::tensor(v, longs).to(device); };
  StepBatch batch;
  batch.tokens = at::zeros({static_cast<int64_t>(positions.size())}, longs.device(device));
  batch.paged.positions = onDevice(positions);
  batch.paged.slots = onDevice(slots);
  batch.paged.logitRows = onDevice(logitRows);
  PagedSequences& s = batch.paged.sequences;
  s.blockTables = at::full({static_cast<int64_t>(contextLens.size()), width}, scratchBlock, longs.device(device));
  s.contextLens = onDevice(contextLens);
  s.contextLensHost = contextLens;
  s.queryStarts = queryStarts;
  s.numSingleQuery = decodes;
  s.blockSize = limits.blockSize;
  s.slidingWindow = slidingWindow;
  return batch;
}

}  // namespace

int64_t warmUpRollout(DecoderModel& model, PagedKvCache& cache, const rollout::SchedulerLimits& limits,
                      int64_t scratchBlock, DecodeGraphs* graphs) {
  if (!model.device().is_cuda()) return 0;
  const StepBatch step = scratchStep(limits, scratchBlock, model.config().slidingWindow, model.device());
  const at::Tensor logits = model.pagedLogits(step.tokens, step.paged, cache);
  // The sampler's kernels: argmax and the chosen tokens' logprobs, and a filtered draw with the
  // top logprobs (softmax, sort, cumulative sums, the inverse-CDF search).
  planner::SamplingParams greedy{.temperature = 0}, filtered{.topK = 50, .topP = 0.9, .minP = 0.01, .logprobs = 1};
  at::Generator generator = sampleGenerator(0, 0);
  drawTokens(logits, {Draw{.row = 0, .params = &greedy}, Draw{.row = 0, .params = &filtered, .generator = &generator}});
  const int64_t captured = graphs ? graphs->captureAll() : 0;
  synchronize(model.device());
  return captured;
}

}  // namespace loom::worker
