#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace loom::data {

// GPT-2's byte-level alphabet: each of the 256 byte values stands for one printable character
// (the printable ASCII and Latin-1 bytes for themselves, the others for U+0100 onwards), so a
// vocabulary of strings covers any byte sequence. The ByteLevel pre-tokenizer and decoder of
// tokenizer.json use it.

// `bytes` written in the byte-level alphabet (as UTF-8).
std::string toByteLevel(std::string_view bytes);
// Appends to *out the bytes the byte-level characters of `token` stand for; false (and *out
// unchanged) when a character is outside the alphabet.
bool appendFromByteLevel(std::string_view token, std::string* out);

}  // namespace loom::data
