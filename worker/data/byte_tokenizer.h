#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// The byte-level tokenizer: every byte of the UTF-8 text is one token, its value 0..255, and 256
// ends a document. Needs no vocabulary file and loses nothing, at the price of long sequences:
// the tokenizer for small models, tests and examples.
inline constexpr uint32_t kByteEosToken = 256;
inline constexpr int64_t kByteVocabSize = 257;
inline constexpr char kByteTokenizerName[] = "bytes";
// How decodeBytes shows an end of document, on a line of its own.
inline constexpr char kByteEosText[] = "\n<|eos|>\n";

// The bytes of `text` as tokens; no end-of-document token is added.
std::vector<uint32_t> encodeBytes(std::string_view text);
// The inverse of encodeBytes. kByteEosToken becomes kByteEosText (so a sample shows where
// documents end), and an id outside the vocabulary becomes U+FFFD, the replacement character.
// The bytes are returned as they are: a sequence cut mid-character is not valid UTF-8.
std::string decodeBytes(const std::vector<int64_t>& tokens);

}  // namespace loom::data
