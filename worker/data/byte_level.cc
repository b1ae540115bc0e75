#include "worker/data/byte_level.h"

#include <array>
#include <unordered_map>

#include "worker/data/utf8.h"

namespace loom::data {

namespace {

struct Alphabet {
  std::array<std::string, 256> charOfByte;  // UTF-8
  std::unordered_map<char32_t, unsigned char> byteOfChar;
};

// bytes_to_unicode() of GPT-2's encoder.py.
const Alphabet& alphabet() {
  static const Alphabet a = [] {
    Alphabet out;
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : next++;
      utf8::append(c, &out.charOfByte[b]);
      out.byteOfChar[c] = static_cast<unsigned char>(b);
    }
    return out;
  }();
  return a;
}

}  // namespace

std::string toByteLevel(std::string_view bytes) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) out += a.charOfByte[static_cast<unsigned char>(b)];
  return out;
}

bool appendFromByteLevel(std::string_view token, std::string* out) {
  const Alphabet& a = alphabet();
  const size_t before = out->size();
  for (size_t pos = 0; pos < token.size();) {
    auto it = a.byteOfChar.find(utf8::decodeNext(token, &pos));
    if (it == a.byteOfChar.end()) {
      out->resize(before);
      return false;
    }
    out->push_back(static_cast<char>(it->second));
  }
  return true;
}

}  // namespace loom::data
