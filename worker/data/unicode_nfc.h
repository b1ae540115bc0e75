#pragma once

#include <string>
#include <string_view>

namespace loom::data::unicode {

// `text` in Normalization Form C, as the `tokenizers` package's NFC normalizer makes it: its
// tables are Unicode 9.0's, so a combining mark assigned later counts as a starter and is neither
// reordered nor composed (unicode_tables.h). Ill-formed UTF-8 becomes U+FFFD. Thread-safe.
std::string toNfc(std::string_view text);

// The canonical combining class of a code point under the same tables (0 for a starter).
int combiningClassOf(char32_t codePoint);

}  // namespace loom::data::unicode
