#include "worker/data/pre_tokenizer.h"

#include <algorithm>
#include <array>
#include <initializer_list>

#include "worker/data/unicode_classes.h"
#include "worker/data/utf8.h"

namespace loom::data {

namespace {

using unicode::CharClass;

// As tokenizer.json spells them (split only to fit the line).
constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+)"
    R"(|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S))"
    R"(|\s+)";
constexpr std::string_view kTekkenRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The text as code points, with their classes and byte offsets (offsets has one more entry: the
// end). A matcher takes the index of a code point and returns the index one past its match, or
// the same index when nothing matches there.
struct CodePoints {
  std::vector<char32_t> cps;
  std::vector<CharClass> classes;
  std::vector<size_t> offsets;

  size_t size() const { return cps.size(); }
  // Whether there is a code point i and it satisfies pred: past the end, no class matches.
  template <typename Pred>
  bool is(size_t i, Pred pred) const {
    return i < cps.size() && pred(classes[i], cps[i]);
  }
  // The first index from i whose code point fails pred.
  template <typename Pred>
  size_t runEnd(size_t i, Pred pred) const {
    while (is(i, pred)) ++i;
    return i;
  }
};

CodePoints decode(std::string_view text) {
  CodePoints t;
  t.cps.reserve(text.size());
  t.offsets.reserve(text.size() + 1);
  for (size_t pos = 0; pos < text.size();) {
    t.offsets.push_back(pos);
    t.cps.push_back(utf8::decodeNext(text, &pos));
  }
  t.offsets.push_back(text.size());
  t.classes.reserve(t.cps.size());
  for (char32_t c : t.cps) t.classes.push_back(unicode::charClassOf(c));
  return t;
}

// The character classes of the patterns, as predicates over (class, code point).
bool letter(CharClass c, char32_t) { return unicode::isLetter(c); }                       // \p{L}
bool number(CharClass c, char32_t) { return unicode::isNumber(c); }                       // \p{N}
bool space(CharClass c, char32_t) { return unicode::isSpace(c); }                         // \s
bool other(CharClass c, char32_t cp) {  // [^\s\p{L}\p{N}]
  return !letter(c, cp) && !number(c, cp) && !space(c, cp);
}
bool lineBreak(CharClass, char32_t cp) { return cp == '\r' || cp == '\n'; }               // [\r\n]
bool lineBreakOrSlash(CharClass c, char32_t cp) { return lineBreak(c, cp) || cp == '/'; }  // [\r\n/]
bool prefix(CharClass c, char32_t cp) {  // [^\r\n\p{L}\p{N}]
  return !lineBreak(c, cp) && !letter(c, cp) && !number(c, cp);
}
bool upperish(CharClass c, char32_t) {  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
  return c == CharClass::kUppercaseLetter || c == CharClass::kTitlecaseLetter || c == CharClass::kModifierLetter ||
         c == CharClass::kOtherLetter || c == CharClass::kMark;
}
bool lowerish(CharClass c, char32_t) {  // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
  return c == CharClass::kLowercaseLetter || c == CharClass::kModifierLetter || c == CharClass::kOtherLetter ||
         c == CharClass::kMark;
}

// 's|'t|'re|'ve|'m|'ll|'d, or its (?i:...) form. Case folding matches the ASCII capitals, and
// U+017F LATIN SMALL LETTER LONG S for s, as Oniguruma does.
size_t contraction(const CodePoints& t, size_t i, bool ignoreCase) {
  if (t.cps[i] != '\'') return i;
  auto at = [&](size_t k) -> char32_t {
    if (k >= t.size()) return 0;
    const char32_t c = t.cps[k];
    if (!ignoreCase) return c;
    if (c >= 'A' && c <= 'Z') return c - 'A' + 'a';
    return c == 0x17F ? 's' : c;
  };
  const char32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  const char32_t b = at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return i;
}

// \s+(?!\S)|\s+ : a run of white space, less its last character when a non-space follows (which
// then starts the next piece, as the space before a word does).
size_t trailingSpace(const CodePoints& t, size_t i) {
  const size_t j = t.runEnd(i, space);
  if (j == i || j == t.size() || j - i == 1) return j;
  return j - 1;
}

// \s*[\r\n]+ : white space up to and including its last line break.
size_t spaceToLineBreak(const CodePoints& t, size_t i) {
  for (size_t k = t.runEnd(i, space); k > i; --k)
    if (lineBreak(t.classes[k - 1], t.cps[k - 1])) return k;
  return i;
}

// ` ?X+` with X one of the classes: an optional space (U+0020) before a run of X.
template <typename Pred>
size_t spaceThenRun(const CodePoints& t, size_t i, Pred pred) {
  if (t.cps[i] == ' ' && t.is(i + 1, pred)) return t.runEnd(i + 1, pred);
  return t.runEnd(i, pred);
}

size_t matchGpt2(const CodePoints& t, size_t i) {
  if (size_t e = contraction(t, i, false); e > i) return e;
  for (auto pred : {letter, number, other})
    if (size_t e = spaceThenRun(t, i, pred); e > i) return e;
  return trailingSpace(t, i);
}

size_t matchLlama3Family(const CodePoints& t, size_t i, size_t maxDigits) {
  if (size_t e = contraction(t, i, true); e > i) return e;
  if (t.is(i, prefix) && t.is(i + 1, letter)) return t.runEnd(i + 1, letter);  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (t.is(i, letter)) return t.runEnd(i, letter);
  if (t.is(i, number)) return std::min(t.runEnd(i, number), i + maxDigits);  // \p{N}{1,3} or \p{N}
  if (size_t e = spaceThenRun(t, i, other); e > i) return t.runEnd(e, lineBreak);  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  if (size_t e = spaceToLineBreak(t, i); e > i) return e;
  return trailingSpace(t, i);
}

size_t matchTekken(const CodePoints& t, size_t i) {
  // The optional [^\r\n\p{L}\p{N}] before a word is tried taken first, then left out.
  std::array<size_t, 2> starts{i + 1, i};
  const size_t firstStart = t.is(i, prefix) && i + 1 < t.size() ? 0 : 1;
  // [upper]*[lower]+ : if no lowercase-ish character follows the run, the run gives back
  // characters until its last one that is lowercase-ish too (Lm, Lo, M).
  for (size_t s = firstStart; s < starts.size(); ++s) {
    const size_t e = t.runEnd(starts[s], upperish);
    if (t.is(e, lowerish)) return t.runEnd(e, lowerish);
    for (size_t k = e; k > starts[s]; --k)
      if (lowerish(t.classes[k - 1], t.cps[k - 1])) return k;
  }
  for (size_t s = firstStart; s < starts.size(); ++s) {  // [upper]+[lower]*
    const size_t e = t.runEnd(starts[s], upperish);
    if (e > starts[s]) return t.runEnd(e, lowerish);
  }
  if (t.is(i, number)) return i + 1;
  if (size_t e = spaceThenRun(t, i, other); e > i) return t.runEnd(e, lineBreakOrSlash);
  if (size_t e = spaceToLineBreak(t, i); e > i) return e;
  return trailingSpace(t, i);
}

size_t matchAt(const CodePoints& t, size_t i, SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return matchGpt2(t, i);
    case SplitPattern::kLlama3:
      return matchLlama3Family(t, i, 3);
    case SplitPattern::kQwen2:
      return matchLlama3Family(t, i, 1);
    case SplitPattern::kTekken:
      return matchTekken(t, i);
  }
  return i;
}

}  // namespace

std::optional<SplitPattern> splitPatternOf(std::string_view regex) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2, SplitPattern::kTekken})
    if (regexOf(p) == regex) return p;
  return std::nullopt;
}

std::string_view regexOf(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return kGpt2Regex;
    case SplitPattern::kLlama3:
      return kLlama3Regex;
    case SplitPattern::kQwen2:
      return kQwen2Regex;
    case SplitPattern::kTekken:
      return kTekkenRegex;
  }
  return {};
}

std::vector<std::string_view> splitIsolated(std::string_view text, SplitPattern pattern) {
  const CodePoints t = decode(text);
  std::vector<std::string_view> pieces;
  auto piece = [&](size_t from, size_t to) {
    pieces.push_back(text.substr(t.offsets[from], t.offsets[to] - t.offsets[from]));
  };
  // Every pattern here matches at every position (its last alternatives cover each class), but a
  // position where none did would join the run of unmatched text, as in `tokenizers`.
  size_t unmatched = 0;
  for (size_t i = 0; i < t.size();) {
    const size_t end = matchAt(t, i, pattern);
    if (end == i) {
      ++i;
      continue;
    }
    if (unmatched < i) piece(unmatched, i);
    piece(i, end);
    i = unmatched = end;
  }
  if (unmatched < t.size()) piece(unmatched, t.size());
  return pieces;
}

}  // namespace loom::data
