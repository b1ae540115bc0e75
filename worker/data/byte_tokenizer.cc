#include "worker/data/byte_tokenizer.h"

namespace loom::data {

std::vector<uint32_t> encodeBytes(std::string_view text) {
  std::vector<uint32_t> tokens;
  tokens.reserve(text.size());
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

std::string decodeBytes(const std::vector<int64_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int64_t token : tokens) {
    if (token >= 0 && token < 256) {
      text.push_back(static_cast<char>(token));
    } else if (token == kByteEosToken) {
      text += kByteEosText;
    } else {
      text += "\xEF\xBF\xBD";  // U+FFFD
    }
  }
  return text;
}

}  // namespace loom::data
