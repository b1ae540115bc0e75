#include "worker/data/pre_tokenizer.h"

#include <string>
#include <vector>

#include "tests/catch.h"

using namespace loom::data;

namespace {

std::vector<std::string> split(std::string_view text, SplitPattern pattern) {
  std::vector<std::string> out;
  for (std::string_view piece : splitIsolated(text, pattern)) out.emplace_back(piece);
  return out;
}

using Pieces = std::vector<std::string>;

}  // namespace

// The expected pieces are what the `tokenizers` package's Split(Regex(...), "isolated") gives.

TEST_CASE("pre-tokenizer: the known patterns are recognised by their exact text", "[hf_tokenizer]") {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2, SplitPattern::kTekken})
    CHECK(splitPatternOf(regexOf(p)) == p);
  CHECK(!splitPatternOf(R"(\d+)").has_value());
  CHECK(!splitPatternOf(std::string(regexOf(SplitPattern::kLlama3)) + " ").has_value());
}

TEST_CASE("pre-tokenizer: contractions, case-sensitive in GPT-2's pattern, not in Llama 3's", "[hf_tokenizer]") {
  const std::string text = "I'm sure they'll say WE'RE done, it's Bob's";
  CHECK(split(text, SplitPattern::kGpt2) == Pieces{"I", "'m", " sure", " they", "'ll", " say", " WE", "'", "RE",
                                                   " done", ",", " it", "'s", " Bob", "'s"});
  const Pieces folded{"I", "'m", " sure", " they", "'ll", " say", " WE", "'RE",
                      " done", ",", " it", "'s", " Bob", "'s"};
  CHECK(split(text, SplitPattern::kLlama3) == folded);
  CHECK(split(text, SplitPattern::kQwen2) == folded);
  // Oniguruma folds the long s to s.
  CHECK(split("'\u017Fx", SplitPattern::kLlama3) == Pieces{"'\u017F", "x"});
  CHECK(split("'\u017Fx", SplitPattern::kGpt2) == Pieces{"'", "\u017Fx"});
}

TEST_CASE("pre-tokenizer: numbers of 1 to 5 digits", "[hf_tokenizer]") {
  const std::string text = "7 42 123 2024 31415";
  CHECK(split(text, SplitPattern::kGpt2) == Pieces{"7", " 42", " 123", " 2024", " 31415"});
  CHECK(split(text, SplitPattern::kLlama3) ==
        Pieces{"7", " ", "42", " ", "123", " ", "202", "4", " ", "314", "15"});
  CHECK(split(text, SplitPattern::kQwen2) == Pieces{"7", " ", "4", "2", " ", "1", "2", "3", " ", "2", "0", "2", "4",
                                                    " ", "3", "1", "4", "1", "5"});
  CHECK(split("½Ⅻ٣", SplitPattern::kLlama3) == Pieces{"½Ⅻ٣"});  // \p{N} is every number, not just 0-9
}

TEST_CASE("pre-tokenizer: runs of white space leave their last space to the next word", "[hf_tokenizer]") {
  CHECK(split("a  b   c\tword", SplitPattern::kGpt2) == Pieces{"a", " ", " b", "  ", " c", "\t", "word"});
  CHECK(split("a  b   c\tword", SplitPattern::kLlama3) == Pieces{"a", " ", " b", "  ", " c", "\tword"});
  CHECK(split("end   ", SplitPattern::kGpt2) == Pieces{"end", "   "});
  // U+00A0 and U+3000 are white space (\s is the White_Space property); U+001C is not.
  CHECK(split("x\u00A0\u3000\u00A0y\x1C", SplitPattern::kGpt2) == Pieces{"x", "\u00A0\u3000", "\u00A0", "y", "\x1C"});
}

TEST_CASE("pre-tokenizer: newlines", "[hf_tokenizer]") {
  const std::string text = "line one\n\n  line two\r\nend  \n";
  CHECK(split(text, SplitPattern::kGpt2) ==
        Pieces{"line", " one", "\n\n ", " line", " two", "\r", "\n", "end", "  \n"});
  const Pieces llama{"line", " one", "\n\n", " ", " line", " two", "\r\n", "end", "  \n"};
  CHECK(split(text, SplitPattern::kLlama3) == llama);
  CHECK(split(text, SplitPattern::kTekken) == llama);
  // Punctuation takes the newlines after it.
  CHECK(split("x;\n\ny", SplitPattern::kLlama3) == Pieces{"x", ";\n\n", "y"});
}

TEST_CASE("pre-tokenizer: CJK, emoji and combining marks", "[hf_tokenizer]") {
  CHECK(split("你好，世界！ 日本語", SplitPattern::kGpt2) == Pieces{"你好", "，", "世界", "！", " 日本語"});
  CHECK(split("你好，世界！ 日本語", SplitPattern::kLlama3) == Pieces{"你好", "，世界", "！", " 日本語"});
  const Pieces emoji{"hi", " 👍🏽", " there", " 👨‍👩‍👧!"};
  CHECK(split("hi 👍🏽 there 👨‍👩‍👧!", SplitPattern::kGpt2) == emoji);
  CHECK(split("hi 👍🏽 there 👨‍👩‍👧!", SplitPattern::kQwen2) == emoji);
  // A combining mark is not \p{L}: a decomposed word falls apart unless NFC composes it first.
  const std::string decomposed = "cafe\u0301 na\u0308ive";
  CHECK(split(decomposed, SplitPattern::kGpt2) == Pieces{"cafe", "\u0301", " na", "\u0308", "ive"});
  CHECK(split(decomposed, SplitPattern::kLlama3) == Pieces{"cafe", "\u0301", " na", "\u0308ive"});
  // Mistral's letter classes take marks in.
  CHECK(split(decomposed, SplitPattern::kTekken) == Pieces{"cafe\u0301", " na\u0308ive"});
}

TEST_CASE("pre-tokenizer: Mistral's pattern splits words where lowercase turns to uppercase", "[hf_tokenizer]") {
  CHECK(split("HELLOworld CamelCase x/y//", SplitPattern::kTekken) ==
        Pieces{"HELLOworld", " Camel", "Case", " x", "/y", "//"});
  CHECK(split("HELLOworld CamelCase x/y//", SplitPattern::kGpt2) ==
        Pieces{"HELLOworld", " CamelCase", " x", "/", "y", "//"});
  CHECK(split("ABC, ǅx", SplitPattern::kTekken) == Pieces{"ABC", ",", " ǅx"});
}

TEST_CASE("pre-tokenizer: pieces cover the text, ill-formed UTF-8 included", "[hf_tokenizer]") {
  CHECK(split("", SplitPattern::kLlama3).empty());
  const std::string bad = "ab\xC3(\xFF  x";
  std::string joined;
  for (const auto& piece : split(bad, SplitPattern::kLlama3)) joined += piece;
  CHECK(joined == bad);
}
