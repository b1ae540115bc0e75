#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/rollout_spec.h"
#include "worker/data/hf_tokenizer.h"

namespace loom::rollout {

// One line of a rollout's prompts file (rollout.prompts, JSONL):
//   {"id": "q1", "prompt": "text", "sampling": {"temperature": 0.7, "n": 4}}
//   {"prompt_token_ids": [128000, 9906], "sampling": {"max_new_tokens": 64}}
// "id" (a string or a number) defaults to the line number; the prompt is text (which needs the
// tokenizer) or token ids; "sampling" overrides rollout.sampling's keys for this request;
// "reference" rides along for scoring (below); "arrival_s" holds the request back until that many seconds after the job's start (a
// benchmark's arrival schedule).
struct PromptLine {
  std::string id;
  int64_t line = 0;  // from 1
  std::string text;
  std::vector<int64_t> tokenIds;
  bool isText = false;
  planner::SamplingParams sampling;
  double arrivalS = 0;
  // "reference": what a reward rule compares the answer with (response_samples.h): text, or token
  // ids; the rollout passes it through to the results line untouched.
  nlohmann::json reference;
};

// Reads and checks every line before anything runs: a malformed line, an unknown key, a bad
// sampling value or a repeated id is an error naming the file and the line. Blank lines are skipped.
StatusOr<std::vector<PromptLine>> readPromptsFile(const std::string& path, const planner::SamplingParams& defaults);

// What a request asks of the rollout's tokenizer when it has none (null): a text prompt, or stop
// strings (stop_token_ids need none). A served request and a prompts file's line alike.
Status checkTokenizerNeeds(bool isText, const planner::SamplingParams& sampling, const data::HfTokenizer* tokenizer);

// A request's prompt as token ids: `ids`, or `text` through the tokenizer with the template's
// special tokens (as vLLM encodes a completion prompt); checkTokenizerNeeds first.
StatusOr<std::vector<int64_t>> promptTokenIds(bool isText, const std::string& text, std::vector<int64_t> ids,
                                              const planner::SamplingParams& sampling,
                                              const data::HfTokenizer* tokenizer);

}  // namespace loom::rollout
