#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace loom::data {

// The Split pre-tokenizer patterns Loom knows. Each is matched by hand over code points, with the
// semantics of the backtracking regex engine inside the `tokenizers` package (Oniguruma): at each
// position the first alternative that can match wins, greedy quantifiers give back characters
// only as far as the rest needs. No general regex engine: a tokenizer.json with another pattern
// is refused by name.
enum class SplitPattern {
  kGpt2,    // GPT-2's, also what ByteLevel's use_regex applies
  kLlama3,  // Llama 3's (tiktoken's cl100k): case-insensitive contractions, numbers of 1 to 3 digits
  kQwen2,   // Qwen2's and Qwen3's: Llama 3's with single-digit numbers
  kTekken,  // Mistral's (Tekken, o200k-like): words split at case changes, single digits, no contractions
};

// The pattern whose regex, exactly as tokenizer.json spells it, is `regex`; nullopt if unknown.
std::optional<SplitPattern> splitPatternOf(std::string_view regex);
// The regex of `pattern`, as tokenizer.json spells it.
std::string_view regexOf(SplitPattern pattern);

// Splits `text` (UTF-8; an ill-formed byte counts as U+FFFD) the way Split(pattern,
// behavior="Isolated") does: every match is a piece, and so is every run of text between
// matches. The pieces are views into `text`, in order, none empty; together they are all of it.
std::vector<std::string_view> splitIsolated(std::string_view text, SplitPattern pattern);

}  // namespace loom::data
