#include "worker/data/utf8.h"

namespace loom::data::utf8 {

namespace {

// What a lead byte starts: the sequence length and the range its second byte must lie in (the
// narrower ranges exclude overlong forms, surrogates and code points above U+10FFFF). Length 0: a
// byte that starts no sequence.
struct Lead {
  int length;
  unsigned char secondMin;
  unsigned char secondMax;
};

Lead leadOf(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

bool isContinuation(unsigned char b) { return b >= 0x80 && b <= 0xBF; }

// How many bytes from text[pos] belong to the sequence its lead byte starts, stopping at the first
// that cannot: the whole sequence when it is well formed, else its maximal subpart.
int validPrefixLength(std::string_view text, size_t pos, const Lead& lead) {
  int n = 1;
  while (n < lead.length && pos + n < text.size()) {
    const auto b = static_cast<unsigned char>(text[pos + n]);
    const bool ok = n == 1 ? (b >= lead.secondMin && b <= lead.secondMax) : isContinuation(b);
    if (!ok) break;
    ++n;
  }
  return n;
}

}  // namespace

char32_t decodeNext(std::string_view text, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(text[*pos]);
  const Lead lead = leadOf(b0);
  if (lead.length == 1) {
    ++*pos;
    return b0;
  }
  if (lead.length == 0) {
    ++*pos;
    return kReplacementCharacter;
  }
  const int n = validPrefixLength(text, *pos, lead);
  if (n < lead.length) {
    *pos += n;
    return kReplacementCharacter;
  }
  char32_t cp = b0 & (0x7F >> lead.length);
  for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[*pos + i]) & 0x3F);
  *pos += n;
  return cp;
}

void append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t firstInvalidOffset(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {  // the common case, without the table
      ++pos;
      continue;
    }
    const Lead lead = leadOf(static_cast<unsigned char>(text[pos]));
    if (lead.length == 0 || validPrefixLength(text, pos, lead) < lead.length) return pos;
    pos += lead.length;
  }
  return std::string_view::npos;
}

std::string toValidLossy(std::string_view bytes) {
  const size_t invalid = firstInvalidOffset(bytes);
  if (invalid == std::string_view::npos) return std::string(bytes);
  std::string out(bytes.substr(0, invalid));
  size_t pos = invalid;
  while (pos < bytes.size()) append(decodeNext(bytes, &pos), &out);
  return out;
}

size_t incompleteTailLength(std::string_view bytes) {
  for (size_t tail = 1; tail <= 3 && tail <= bytes.size(); ++tail) {
    const size_t pos = bytes.size() - tail;
    const Lead lead = leadOf(static_cast<unsigned char>(bytes[pos]));
    if (lead.length == 0 && isContinuation(static_cast<unsigned char>(bytes[pos]))) continue;  // look further back
    // A lead byte: the tail is incomplete if the sequence is longer and all of it so far is valid.
    if (lead.length > static_cast<int>(tail) && validPrefixLength(bytes, pos, lead) == static_cast<int>(tail))
      return tail;
    return 0;
  }
  return 0;
}

}  // namespace loom::data::utf8
