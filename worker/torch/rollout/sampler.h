#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

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

// Tokens drawn on the logits' device and on their way to the host: the next step's decodes read
// `tokens` on the device while the copies run, and collectDraws waits for the copies alone.
struct LaunchedDraws {
  at::Tensor tokens;  // [D] int64, on the logits' device
  at::Tensor hostTokens, hostLogprobs, hostTopIds, hostTopValues;  // pinned when copied from a GPU
  std::vector<int64_t> topCounts;  // per draw: how many top logprobs it asked for
  std::shared_ptr<c10::Event> copied;  // null on the CPU
};
// drawTokens in two halves, the first drawing every uniform number from the generators.
LaunchedDraws launchDraws(const at::Tensor& logits, const std::vector<Draw>& draws);
std::vector<DrawnToken> collectDraws(const LaunchedDraws& launched);

// The generator of sample `sample` of a request drawn with `seed`.
at::Generator sampleGenerator(uint64_t seed, int64_t sample);

}  // namespace loom::worker
