#include "worker/rollout/sample_text.h"

#include <algorithm>

namespace loom::rollout {

SampleText::SampleText(const data::HfTokenizer& tokenizer, std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {
  for (const std::string& s : stops_) longestStop_ = std::max(longestStop_, s.size());
}

bool SampleText::append(int64_t token) {
  if (stopped_) return true;
  ids_.push_back(static_cast<uint32_t>(token));
  const data::DecodedText piece = tokenizer_.decodeIncrementally(ids_, emitted_, /*skipSpecialTokens=*/true);
  emitted_ = piece.emittedTokens;
  if (piece.text.empty()) return false;
  // A stop string may straddle the new text and the old: search from where it could start.
  const size_t from = text_.size() > longestStop_ ? text_.size() - longestStop_ : 0;
  text_ += piece.text;
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) cut = std::min(cut, text_.find(stop, from));
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  stopped_ = true;
  return true;
}

size_t SampleText::settledSize() const {
  if (stopped_ || longestStop_ == 0) return text_.size();
  // A stop string's first longestStop_ - 1 bytes may already be here, waiting for its last.
  size_t settled = text_.size() >= longestStop_ ? text_.size() - (longestStop_ - 1) : 0;
  while (settled > 0 && settled < text_.size() && (static_cast<unsigned char>(text_[settled]) & 0xC0) == 0x80)
    --settled;
  return settled;
}

std::string SampleText::finish() {
  if (!stopped_ && emitted_ < ids_.size())
    text_ += tokenizer_.decodeIncrementally(ids_, emitted_, /*skipSpecialTokens=*/true, /*final=*/true).text;
  emitted_ = ids_.size();
  stopped_ = true;
  return text_;
}

}  // namespace loom::rollout
