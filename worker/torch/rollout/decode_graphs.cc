#include "worker/torch/rollout/decode_graphs.h"

#include <map>
#include <vector>

#include <ATen/ATen.h>

#include "worker/torch/model/plugin_ops.h"
#ifdef LOOM_HAVE_NCCL
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace loom::worker {

#ifdef LOOM_HAVE_NCCL
namespace {

class CudaDecodeGraphs final : public DecodeGraphs {
 public:
  CudaDecodeGraphs(DecoderModel& model, PagedKvCache& cache, int64_t maxBatch, int64_t maxBlocksPerSequence,
                   int64_t scratchBlock)
      : model_(model), cache_(cache), maxBatch_(maxBatch), width_(maxBlocksPerSequence), scratch_(scratchBlock),
        pool_(at::cuda::graph_pool_handle()) {}

  bool covers(const StepBatch& batch) const override {
    const PagedSequences& s = batch.paged.sequences;
    return s.numSingleQuery == s.numSequences() && s.numSequences() <= maxBatch_ &&
           batch.paged.logitRows.size(0) == s.numSequences();
  }

  at::Tensor run(const StepBatch& batch) override {
    const int64_t n = batch.paged.sequences.numSequences();
    Graph& g = graphOf(sizeFor(n));
    const PagedSequences& s = batch.paged.sequences;
    // Rows past n keep the padding they were captured with: the scratch slot, one position.
    g.tokens.narrow(0, 0, n).copy_(batch.tokens, /*non_blocking=*/true);
    g.step.positions.narrow(0, 0, n).copy_(batch.paged.positions, true);
    g.step.slots.narrow(0, 0, n).copy_(batch.paged.slots, true);
    g.step.sequences.contextLens.narrow(0, 0, n).copy_(s.contextLens, true);
    g.step.sequences.blockTables.narrow(0, 0, n).narrow(1, 0, s.blockTables.size(1)).copy_(s.blockTables, true);
    g.graph->replay();
    return g.logits.narrow(0, 0, n);
  }

  int64_t captureAll() override {
    std::vector<int64_t> sizes;
    for (int64_t n = 1; n <= maxBatch_; ++n)
      if (sizeFor(n) == n) sizes.push_back(n);
    for (auto size = sizes.rbegin(); size != sizes.rend(); ++size) graphOf(*size);
    return static_cast<int64_t>(graphs_.size());
  }

 private:
  struct Graph {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    at::Tensor tokens, logits;
    PagedStep step;
  };

  int64_t sizeFor(int64_t n) const {
    for (int64_t size : {1, 2, 4, 8})
      if (n <= size) return std::min(size, maxBatch_);
    return std::min(maxBatch_, (n + 15) / 16 * 16);
  }

  Graph& graphOf(int64_t size) {
    auto found = graphs_.find(size);
    if (found != graphs_.end()) return found->second;
    Graph& g = graphs_[size];
    const auto longs = at::TensorOptions().dtype(at::kLong).device(model_.device());
    g.tokens = at::zeros({size}, longs);
    g.step.positions = at::zeros({size}, longs);
    g.step.slots = at::full({size}, scratch_ * cache_.blockSize, longs);
    g.step.logitRows = at::arange(size, longs);
    PagedSequences& s = g.step.sequences;
    s.blockTables = at::full({size, width_}, scratch_, longs);
    s.contextLens = at::ones({size}, longs);
    s.contextLensHost.assign(size, 1);
    for (int64_t i = 0; i <= size; ++i) s.queryStarts.push_back(i);
    s.numSingleQuery = size;
    s.blockSize = cache_.blockSize;
    s.slidingWindow = model_.config().slidingWindow;
    // Warm up (lazy initialisations, the RoPE table) and capture on a side stream, as capture
    // requires; the current stream waits for both.
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(model_.device().index());
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, model_.device().index());
    current.synchronize();
    {
      const c10::cuda::CUDAStreamGuard onSide(side);
      model_.pagedLogits(g.tokens, g.step, cache_);
      g.graph = std::make_unique<at::cuda::CUDAGraph>();
      g.graph->capture_begin(pool_);
      g.logits = model_.pagedLogits(g.tokens, g.step, cache_);
      g.graph->capture_end();
    }
    side.synchronize();
    return g;
  }

  DecoderModel& model_;
  PagedKvCache& cache_;
  int64_t maxBatch_, width_, scratch_;
  at::cuda::MempoolId_t pool_;
  std::map<int64_t, Graph> graphs_;
};

}  // namespace
#endif

std::unique_ptr<DecodeGraphs> makeDecodeGraphs(DecoderModel& model, PagedKvCache& cache, int64_t maxBatch,
                                               int64_t maxBlocksPerSequence, int64_t scratchBlock) {
#ifdef LOOM_HAVE_NCCL
  // Under tensor parallelism the forward's collectives run on the communicators' own streams.
  const bool tensorParallel = model.shards().tp && model.shards().tp->size() > 1;
  if (model.device().is_cuda() && model.config().numExperts == 0 && !tensorParallel &&
      pluginPagedDecode(model.device()))
    return std::make_unique<CudaDecodeGraphs>(model, cache, maxBatch, maxBlocksPerSequence, scratchBlock);
#endif
  (void)model, (void)cache, (void)maxBatch, (void)maxBlocksPerSequence, (void)scratchBlock;
  return nullptr;
}

}  // namespace loom::worker
