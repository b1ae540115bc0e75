#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::rollout {

// What one sample of one request produced: a line of the rollout's output file (rollout.output),
// which a train job reads back as a training sample (response_samples.h).
struct SampleResult {
  std::string id;     // the request's, from the prompts file
  int64_t order = 0;  // the request's line in the prompts file: the output keeps that order
  int sample = 0;
  std::vector<int64_t> promptTokenIds;
  std::vector<int64_t> tokenIds;
  std::optional<std::string> text;  // with a tokenizer
  std::vector<float> logprobs;      // of each chosen token, from the raw logits
  std::vector<std::vector<std::pair<int64_t, float>>> topLogprobs;  // when the request asked for them
  std::string finishReason;
  double timeToFirstTokenS = 0;  // from the request's arrival
  double timeS = 0;              // arrival to the last token
  nlohmann::json reference;      // the prompt line's, passed through for scoring; null: none
};

// Writes one JSON line per result, in prompts-file order then sample order, to a temporary file
// renamed into place: a reader never sees half a file.
Status writeResultsFile(const std::string& path, std::vector<SampleResult> results);

}  // namespace loom::rollout
