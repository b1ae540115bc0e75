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
    stageDecodeRows(batch, g.rows, scratch_, cache_.blockSize);
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
    DecodeRows rows;
    at::Tensor logits;
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
    g.rows = paddingRows(size, width_, scratch_, cache_.blockSize, model_.config().slidingWindow, model_.device());
    // Warm up (lazy initialisations, the RoPE table) and capture on a side stream, as capture
    // requires; the current stream waits for both.
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(model_.device().index());
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, model_.device().index());
    current.synchronize();
    {
      const c10::cuda::CUDAStreamGuard onSide(side);
      model_.pagedLogits(g.rows.tokens, g.rows.step, cache_);
      g.graph = std::make_unique<at::cuda::CUDAGraph>();
      g.graph->capture_begin(pool_);
      g.logits = model_.pagedLogits(g.rows.tokens, g.rows.step, cache_);
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
