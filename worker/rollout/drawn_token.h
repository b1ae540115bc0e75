#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace loom::rollout {

// A token drawn for a sample, with what the request asked to know about it.
struct DrawnToken {
  int64_t token = 0;
  float logprob = 0;  // log-softmax of the raw logits (before temperature and filters) at the token
  std::vector<std::pair<int64_t, float>> top;  // the params' `logprobs` likeliest tokens, raw logprobs
};

}  // namespace loom::rollout
