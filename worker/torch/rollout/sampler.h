#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "planner/rollout_spec.h"
#include "worker/rollout/drawn_token.h"

namespace loom::worker {

// One token to draw: from which row of the step's logits, by which rules, with which generator.
struct Draw {
  int64_t row = 0;
  const planner::SamplingParams* params = nullptr;
  // The sample's own CPU generator (sampleGenerator), which gives each draw one uniform number:
  // a sample's tokens depend on its seed and its logits only, never on the rest of the batch.
  // Unused when greedy.
  at::Generator* generator = nullptr;
};

using rollout::DrawnToken;

// Draws one token per Draw from logits [R, V] (any float dtype, on any device): greedy (argmax)
// at temperature <= 1e-5; otherwise from softmax(logits / temperature) restricted, in this order,
// to tokens of at least min_p times the likeliest one's probability, to the top_k likeliest, and
// to the smallest set of those whose renormalised probability reaches top_p (vLLM's order).
std::vector<DrawnToken> drawTokens(const at::Tensor& logits, const std::vector<Draw>& draws);

// The generator of sample `sample` of a request drawn with `seed`.
at::Generator sampleGenerator(uint64_t seed, int64_t sample);

}  // namespace loom::worker
