#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::data::unicode {

// The Unicode data the Hugging Face tokenizer needs, generated into unicode_tables.cc by
// scripts/gen-unicode-tables. Read them through unicode_classes.h and unicode_nfc.h.

// What the pre-tokenizer patterns ask of a code point: \s (the White_Space property), \p{L} by
// subcategory (Lu, Ll, Lt, Lm, Lo), \p{M} (Mn, Mc, Me), \p{N} (Nd, Nl, No), or none of these.
enum class CharClass : uint8_t {
  kOther,
  kSpace,
  kUppercaseLetter,
  kLowercaseLetter,
  kTitlecaseLetter,
  kModifierLetter,
  kOtherLetter,
  kMark,
  kNumber,
};

// Runs of one class: a run covers code points from `first` up to the next run's `first`, the last
// up to U+10FFFF. Ascending, the first at 0.
struct CharClassRun {
  char32_t first;
  CharClass charClass;
};

// Code points first..last have this non-zero canonical combining class; ascending, disjoint.
struct CombiningClassRange {
  char32_t first;
  char32_t last;
  uint8_t combiningClass;
};

// One step of a canonical decomposition (apply again to first and second for the full one):
// second is 0 for a singleton. `composes`: NFC composes first + second back into codePoint (a
// primary composite, not a composition exclusion). Hangul syllables are left to arithmetic.
// Ascending by codePoint.
struct CanonicalDecomposition {
  char32_t codePoint;
  char32_t first;
  char32_t second;
  bool composes;
};

extern const char kCharClassUnicodeVersion[];
extern const char kNfcUnicodeVersion[];
extern const CharClassRun kCharClassRuns[];
extern const size_t kCharClassRunCount;
extern const CombiningClassRange kCombiningClassRanges[];
extern const size_t kCombiningClassRangeCount;
extern const CanonicalDecomposition kCanonicalDecompositions[];
extern const size_t kCanonicalDecompositionCount;

}  // namespace loom::data::unicode
