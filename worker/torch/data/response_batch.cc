#include "worker/torch/data/response_batch.h"

#include <algorithm>
#include <limits>

#include <ATen/ATen.h>

namespace loom::worker {

namespace {

constexpr int64_t kIgnored = -100;

}  // namespace

ResponseBatch packResponses(const std::vector<const rollout::ResponseSample*>& samples) {
  const int64_t rows = static_cast<int64_t>(samples.size());
  int64_t width = 1;  // a sample of T tokens has T - 1 inputs with a label
  for (const rollout::ResponseSample* s : samples) width = std::max(width, s->tokens() - 1);
  ResponseBatch out;
  out.inputs = at::zeros({rows, width}, at::kLong);
  out.labels = at::full({rows, width}, kIgnored, at::kLong);
  out.oldLogprobs = at::full({rows, width}, std::numeric_limits<float>::quiet_NaN(), at::kFloat);
  out.advantages = at::zeros({rows, width}, at::kFloat);
  int64_t* inputs = out.inputs.data_ptr<int64_t>();
  int64_t* labels = out.labels.data_ptr<int64_t>();
  float* old = out.oldLogprobs.data_ptr<float>();
  float* advantages = out.advantages.data_ptr<float>();
  for (int64_t b = 0; b < rows; ++b) {
    const rollout::ResponseSample& s = *samples[b];
    const int64_t prompt = static_cast<int64_t>(s.promptTokenIds.size());
    const int64_t tokens = s.tokens();
    auto token = [&](int64_t t) { return t < prompt ? s.promptTokenIds[t] : s.responseTokenIds[t - prompt]; };
    for (int64_t t = 0; t + 1 < tokens; ++t) inputs[b * width + t] = token(t);
    // Position t predicts token t + 1: a response token when t + 1 >= prompt.
    for (int64_t r = 0; r < tokens - prompt; ++r) {
      const int64_t at = b * width + prompt - 1 + r;
      labels[at] = s.responseTokenIds[r];
      if (!s.behaviourLogprobs.empty()) old[at] = s.behaviourLogprobs[r];
      if (!s.advantages.empty()) advantages[at] = s.advantages[r];
    }
    out.responseTokens += tokens - prompt;
  }
  return out;
}

}  // namespace loom::worker
