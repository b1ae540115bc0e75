#include "worker/data/unicode_classes.h"

#include <algorithm>
#include <array>

namespace loom::data::unicode {

namespace {

CharClass searchRuns(char32_t cp) {
  const CharClassRun* end = kCharClassRuns + kCharClassRunCount;
  const CharClassRun* next =
      std::upper_bound(kCharClassRuns, end, cp, [](char32_t c, const CharClassRun& run) { return c < run.first; });
  return (next - 1)->charClass;  // the first run starts at 0, so next > kCharClassRuns
}

// The Basic Multilingual Plane, where nearly all text lies, as a flat table: one load per
// character instead of a binary search over three thousand runs.
const std::array<CharClass, 0x10000>& bmpClasses() {
  static const std::array<CharClass, 0x10000> table = [] {
    std::array<CharClass, 0x10000> t{};
    for (size_t i = 0; i < kCharClassRunCount && kCharClassRuns[i].first < t.size(); ++i) {
      const size_t end = i + 1 < kCharClassRunCount ? std::min<size_t>(kCharClassRuns[i + 1].first, t.size()) : t.size();
      std::fill(t.begin() + kCharClassRuns[i].first, t.begin() + end, kCharClassRuns[i].charClass);
    }
    return t;
  }();
  return table;
}

}  // namespace

CharClass charClassOf(char32_t cp) {
  if (cp < 0x10000) return bmpClasses()[cp];
  if (cp > 0x10FFFF) return CharClass::kOther;
  return searchRuns(cp);
}

}  // namespace loom::data::unicode
