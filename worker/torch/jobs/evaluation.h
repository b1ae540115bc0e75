#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "worker/torch/model/decoder_model.h"
#include "worker/torch/data/token_samples.h"

namespace loom::worker {

struct EvalResult {
  double meanLoss = 0;  // over every evaluated token of every rank
  int64_t samples = 0;
  int64_t tokens = 0;
  at::Tensor logprobs;  // [samples, seq_len] fp32 on every rank, when asked for
};

// Evaluates the first samples of `data` in file order, without gradients: micro-batch b of
// data-parallel rank r holds samples [(b * dp + r) * micro, + micro). `maxBatches` micro-batches
// per rank at most (0: the whole file). Sums are all-reduced over `dp`, the data-parallel group;
// the ranks of a tensor-parallel group evaluate the same samples together.
StatusOr<EvalResult> evaluate(DecoderModel& model, const TokenSamples& data, int64_t microBatchSize,
                              int64_t maxBatches, bool wantLogprobs, backends::Communicator& dp);

}  // namespace loom::worker
