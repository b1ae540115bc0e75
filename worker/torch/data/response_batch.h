#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/rollout/response_samples.h"

namespace loom::worker {

// Rollout samples as a micro-batch: one sample per row, its prompt then its response, right-padded
// to the longest row. The model is trained on the response only: the labels of the prompt's
// positions and of the padding are -100 (DeepSpeed's ResponseTokenBatch.from_rollout: logits at
// position i predict token i + 1, which counts when it is a response token). Padding comes after
// every real token, so causal attention keeps it out of them.
struct ResponseBatch {
  at::Tensor inputs;       // [B, S] int64, padded with token 0
  at::Tensor labels;       // [B, S] int64: the next token where it is a response token, else -100
  at::Tensor oldLogprobs;  // [B, S] fp32: the behaviour policy's logprob of the label; NaN where none is stored
  at::Tensor advantages;   // [B, S] fp32: the label's advantage (0 where the sample has none)
  int64_t responseTokens = 0;  // labels that are not -100
};

ResponseBatch packResponses(const std::vector<const rollout::ResponseSample*>& samples);

}  // namespace loom::worker
