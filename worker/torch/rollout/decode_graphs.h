#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "worker/torch/model/decoder_model.h"
#include "worker/torch/rollout/step_batch.h"

namespace loom::worker {

// Decode steps replayed as CUDA graphs, as vLLM and DeepSpeed's continuous rollout do: a decode
// step launches hundreds of small kernels, and at a few milliseconds a step the GPU would wait on
// the host's launches. One graph per batch size (1, 2, 4, 8, then multiples of 16 up to
// max_num_seqs), captured at start (captureAll) or else the first time a step needs it, over
// static input tensors that each step fills; a step of fewer sequences pads to the next size, its extra rows writing their keys
// and values into a scratch block no sequence holds.
class DecodeGraphs {
 public:
  virtual ~DecodeGraphs() = default;
  // Whether the step can replay a graph: decodes only, no more sequences than the largest size.
  virtual bool covers(const StepBatch& batch) const = 0;
  // The step's logits [sequences, V / tp], from the graph of the smallest size that holds it.
  virtual at::Tensor run(const StepBatch& batch) = 0;
  // Captures the graph of every size not captured yet, largest first (the smaller ones then
  // reuse the largest one's memory in the graphs' pool); returns how many there are.
  virtual int64_t captureAll() = 0;
};

// Null where graphs cannot run: not on a GPU, a build without CUDA, no kernel plugin with paged
// decode attention, tensor parallelism, or a model whose forward synchronizes with the host
// (mixture-of-experts routing sizes its exchanges on the host).
// `scratchBlock` is a block of the cache outside the scheduler's pool.
std::unique_ptr<DecodeGraphs> makeDecodeGraphs(DecoderModel& model, PagedKvCache& cache, int64_t maxBatch,
                                               int64_t maxBlocksPerSequence, int64_t scratchBlock);

}  // namespace loom::worker
