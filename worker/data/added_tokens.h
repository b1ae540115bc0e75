#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// An entry of tokenizer.json's added_tokens: a string that is one token wherever it appears,
// found before the text is normalized or split (special tokens such as <|begin_of_text|>, and
// others).
struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool special = false;     // dropped by decode(skipSpecialTokens)
  bool lstrip = false;      // takes the white space before it
  bool rstrip = false;      // takes the white space after it
  bool normalized = false;  // matched in the normalized text (content normalized too), not the raw
};

// Finds added tokens in text as the `tokenizers` package does: scanning left to right, the
// longest token that starts at the leftmost position where any starts. Immutable after
// construction, so thread-safe.
class AddedTokenMatcher {
 public:
  // A token and the text that stands for it: its content, or its normalized content. Not empty.
  struct Entry {
    AddedToken token;
    std::string matchedText;
  };
  AddedTokenMatcher() = default;  // matches nothing
  explicit AddedTokenMatcher(std::vector<Entry> entries);

  // A piece of text: an added token (with the white space its lstrip/rstrip took), or the text
  // between two (token null). `token` points into the matcher.
  struct Piece {
    std::string_view text;
    const AddedToken* token;
  };
  // The pieces of `text`, in order, none empty; together they are all of it.
  std::vector<Piece> split(std::string_view text) const;

 private:
  // The longest entry matching at text[pos], or nullptr.
  const Entry* longestAt(std::string_view text, size_t pos) const;

  std::vector<Entry> entries_;  // longest first, so the first that matches is the longest
  std::array<bool, 256> firstBytes_{};  // bytes that start some entry: a fast test for most positions
};

}  // namespace loom::data
