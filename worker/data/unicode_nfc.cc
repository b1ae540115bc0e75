#include "worker/data/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "worker/data/unicode_tables.h"
#include "worker/data/utf8.h"

namespace loom::data::unicode {

namespace {

// Hangul syllables decompose and compose by arithmetic (Unicode section 3.12).
constexpr char32_t kHangulBase = 0xAC00, kLeadBase = 0x1100, kVowelBase = 0x1161, kTrailBase = 0x11A7;
constexpr char32_t kLeadCount = 19, kVowelCount = 21, kTrailCount = 28;
constexpr char32_t kSyllableCount = kLeadCount * kVowelCount * kTrailCount;

// The first code point with a canonical decomposition (À).
constexpr char32_t kFirstDecomposable = 0xC0;
// Below U+0300 nothing combines, and whatever decomposes composes back: text made only of such
// characters is already in NFC.
constexpr char32_t kFirstCombining = 0x300;

const CanonicalDecomposition* findDecomposition(char32_t cp) {
  const CanonicalDecomposition* end = kCanonicalDecompositions + kCanonicalDecompositionCount;
  const CanonicalDecomposition* it = std::lower_bound(
      kCanonicalDecompositions, end, cp, [](const CanonicalDecomposition& d, char32_t c) { return d.codePoint < c; });
  return it != end && it->codePoint == cp ? it : nullptr;
}

void decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kHangulBase && cp < kHangulBase + kSyllableCount) {
    const char32_t index = cp - kHangulBase;
    out->push_back(kLeadBase + index / (kVowelCount * kTrailCount));
    out->push_back(kVowelBase + (index % (kVowelCount * kTrailCount)) / kTrailCount);
    if (index % kTrailCount != 0) out->push_back(kTrailBase + index % kTrailCount);
    return;
  }
  const CanonicalDecomposition* d = cp < kFirstDecomposable ? nullptr : findDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second != 0) decompose(d->second, out);
}

uint64_t pairKey(char32_t first, char32_t second) { return (uint64_t{first} << 32) | second; }

const std::unordered_map<uint64_t, char32_t>& primaryComposites() {
  static const std::unordered_map<uint64_t, char32_t> table = [] {
    std::unordered_map<uint64_t, char32_t> t;
    for (size_t i = 0; i < kCanonicalDecompositionCount; ++i) {
      const CanonicalDecomposition& d = kCanonicalDecompositions[i];
      if (d.composes) t.emplace(pairKey(d.first, d.second), d.codePoint);
    }
    return t;
  }();
  return table;
}

std::optional<char32_t> compose(char32_t first, char32_t second) {
  if (first >= kLeadBase && first < kLeadBase + kLeadCount && second >= kVowelBase &&
      second < kVowelBase + kVowelCount)
    return kHangulBase + ((first - kLeadBase) * kVowelCount + (second - kVowelBase)) * kTrailCount;
  if (first >= kHangulBase && first < kHangulBase + kSyllableCount && (first - kHangulBase) % kTrailCount == 0 &&
      second > kTrailBase && second < kTrailBase + kTrailCount)
    return first + (second - kTrailBase);
  const auto& table = primaryComposites();
  auto it = table.find(pairKey(first, second));
  if (it == table.end()) return std::nullopt;
  return it->second;
}

// Canonical ordering: each run of non-starters sorted by combining class, stably.
void reorder(std::vector<char32_t>* cps) {
  auto byClass = [](char32_t a, char32_t b) { return combiningClassOf(a) < combiningClassOf(b); };
  for (auto it = cps->begin(); it != cps->end();) {
    if (combiningClassOf(*it) == 0) {
      ++it;
      continue;
    }
    auto runEnd = std::find_if(it, cps->end(), [](char32_t c) { return combiningClassOf(c) == 0; });
    if (runEnd - it > 1) std::stable_sort(it, runEnd, byClass);
    it = runEnd;
  }
}

// Canonical composition: each character joins the last starter unless something between them
// blocks it (a starter, or a mark of the same or a higher class).
std::vector<char32_t> composeAll(const std::vector<char32_t>& s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  std::optional<size_t> starter;
  int lastClass = 0;  // of the last character kept after the starter
  for (char32_t c : s) {
    const int ccc = combiningClassOf(c);
    if (starter) {
      const bool adjacent = out.size() == *starter + 1;
      if (adjacent || (lastClass != 0 && lastClass < ccc)) {
        if (auto composite = compose(out[*starter], c)) {
          out[*starter] = *composite;
          continue;
        }
      }
    }
    if (ccc == 0) {
      starter = out.size();
      lastClass = 0;
    } else {
      lastClass = ccc;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace

int combiningClassOf(char32_t cp) {
  if (cp < kFirstCombining) return 0;
  const CombiningClassRange* end = kCombiningClassRanges + kCombiningClassRangeCount;
  const CombiningClassRange* it = std::lower_bound(
      kCombiningClassRanges, end, cp, [](const CombiningClassRange& r, char32_t c) { return r.last < c; });
  return it != end && it->first <= cp ? it->combiningClass : 0;
}

std::string toNfc(std::string_view text) {
  // Most text (ASCII, Latin-1) is left as it is: every lead byte below 0xCC is below U+0300.
  const bool trivial =
      std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; });
  if (trivial && utf8::firstInvalidOffset(text) == std::string_view::npos) return std::string(text);

  std::vector<char32_t> decomposed;
  decomposed.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) decompose(utf8::decodeNext(text, &pos), &decomposed);
  reorder(&decomposed);
  std::string out;
  out.reserve(text.size());
  for (char32_t c : composeAll(decomposed)) utf8::append(c, &out);
  return out;
}

}  // namespace loom::data::unicode
