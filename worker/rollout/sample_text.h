#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/data/hf_tokenizer.h"

namespace loom::rollout {

// The text of one sample as its tokens arrive: decoded incrementally (a character split over
// tokens waits for its last byte; special tokens skipped, as vLLM's skip_special_tokens), and
// ended by the first of its stop strings to appear, which the text leaves out (vLLM's default).
class SampleText {
 public:
  SampleText(const data::HfTokenizer& tokenizer, std::vector<std::string> stops);

  // Takes the sample's next token; true when a stop string now ends the text.
  bool append(int64_t token);
  // The text so far, with what the last tokens left undecided (a cut character) flushed.
  std::string finish();
  const std::string& text() const { return text_; }
  // How much of text() is settled: no stop string can still cut it (all of it once stopped or
  // finished). Whole UTF-8 characters, so a stream can send it.
  size_t settledSize() const;

 private:
  const data::HfTokenizer& tokenizer_;
  std::vector<std::string> stops_;
  size_t longestStop_ = 0;
  std::vector<uint32_t> ids_;
  size_t emitted_ = 0;
  std::string text_;
  bool stopped_ = false;
};

}  // namespace loom::rollout
