#pragma once

#include "worker/data/unicode_tables.h"

namespace loom::data::unicode {

// The class of a code point (unicode_tables.h), as the `tokenizers` package's regex engine sees it
// (Unicode 16.0). A value above U+10FFFF is kOther. Thread-safe.
CharClass charClassOf(char32_t codePoint);

inline bool isLetter(CharClass c) {  // \p{L}
  return c >= CharClass::kUppercaseLetter && c <= CharClass::kOtherLetter;
}
inline bool isNumber(CharClass c) { return c == CharClass::kNumber; }  // \p{N}
inline bool isSpace(CharClass c) { return c == CharClass::kSpace; }    // \s

}  // namespace loom::data::unicode
