#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "worker/torch/decoder_model.h"
#include "worker/torch/token_samples.h"

namespace loom::worker {

struct EvalResult {
  double meanLoss = 0;  // over every evaluated token of every rank
  int64_t samples = 0;
  int64_t tokens = 0;
  at::Tensor logprobs;  // [samples, seq_len] fp32 on every rank, when asked for
};

// Evaluates the first samples of `data` in file order, without gradients: micro-batch b of
// data-parallel rank r holds samples [(b * dp + r) * micro, + micro). `maxBatches` micro-batches
// per rank at most (0: the whole file). Sums are all-reduced over `comm` (null: one rank).
StatusOr<EvalResult> evaluate(DecoderModel& model, const TokenSamples& data, int64_t microBatchSize,
                              int64_t maxBatches, bool wantLogprobs, int dpRank, backends::Communicator* comm);

}  // namespace loom::worker
