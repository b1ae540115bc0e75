#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom::data::utf8 {

inline constexpr char32_t kReplacementCharacter = 0xFFFD;

// Decodes the character at text[*pos] and advances *pos past it. An ill-formed sequence decodes
// to U+FFFD and *pos advances over its maximal subpart (at least one byte): the substitution
// Unicode recommends, and Rust's String::from_utf8_lossy makes.
char32_t decodeNext(std::string_view text, size_t* pos);

// Appends the UTF-8 encoding of `codePoint` (a scalar value) to *out.
void append(char32_t codePoint, std::string* out);

// The offset of the first byte that is not part of well-formed UTF-8, or npos when all are.
size_t firstInvalidOffset(std::string_view text);

// `bytes` as valid UTF-8: each maximal ill-formed subpart replaced by U+FFFD, as
// String::from_utf8_lossy does (so decoded text matches the `tokenizers` package's).
std::string toValidLossy(std::string_view bytes);

// How many bytes at the end of `bytes` (0 to 3) begin a character that more bytes could still
// complete. A streaming decoder holds those back; any other ill-formed byte is final.
size_t incompleteTailLength(std::string_view bytes);

}  // namespace loom::data::utf8
