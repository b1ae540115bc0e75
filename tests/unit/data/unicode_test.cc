#include <string>

#include "tests/catch.h"
#include "worker/data/unicode_classes.h"
#include "worker/data/unicode_nfc.h"
#include "worker/data/utf8.h"

using namespace loom::data;

// The expected strings are what the `tokenizers` package's NFC normalizer gives.

TEST_CASE("NFC composes, reorders marks, and leaves composed text alone", "[hf_tokenizer]") {
  using unicode::toNfc;
  CHECK(toNfc("cafe\u0301") == "caf\u00E9");
  CHECK(toNfc("caf\u00E9") == "caf\u00E9");
  CHECK(toNfc("A\u030A") == "\u00C5");
  CHECK(toNfc("\u212B") == "\u00C5");                    // ANGSTROM SIGN: a singleton, never composed back
  CHECK(toNfc("\u1100\u1161\u11A8") == "\uAC01");        // Hangul jamo L V T compose by arithmetic
  CHECK(toNfc("\uAC01") == "\uAC01");
  CHECK(toNfc("q\u0307\u0323") == "q\u0323\u0307");      // dot below (220) before dot above (230)
  CHECK(toNfc("e\u0301\u0301") == "\u00E9\u0301");       // the second acute is blocked by the first
  CHECK(toNfc("\u0301a") == "\u0301a");                  // a mark with no starter before it
  CHECK(toNfc("\u0344") == "\u0308\u0301");              // decomposes to two marks, composes to neither
  CHECK(toNfc("\u0958") == "\u0915\u093C");              // a composition exclusion stays decomposed
  CHECK(toNfc("hello, world\n") == "hello, world\n");
  CHECK(toNfc("") == "");
  // U+1DF6 was assigned after Unicode 9.0, whose tables `tokenizers` normalizes with: a starter
  // there, so the acute after it is not moved in front of it.
  CHECK(toNfc("x\u1DF6\u0301") == "x\u1DF6\u0301");
  CHECK(unicode::combiningClassOf(0x0301) == 230);
  CHECK(unicode::combiningClassOf(0x1DF6) == 0);
  CHECK(unicode::combiningClassOf('a') == 0);
}

TEST_CASE("character classes follow Unicode 16.0, as the regex engine of tokenizers does", "[hf_tokenizer]") {
  using unicode::CharClass;
  using unicode::charClassOf;
  CHECK(charClassOf('a') == CharClass::kLowercaseLetter);
  CHECK(charClassOf('Q') == CharClass::kUppercaseLetter);
  CHECK(charClassOf(0x01C5) == CharClass::kTitlecaseLetter);  // ǅ
  CHECK(charClassOf(0x02B0) == CharClass::kModifierLetter);   // ʰ
  CHECK(charClassOf(0x4E2D) == CharClass::kOtherLetter);      // 中
  CHECK(charClassOf(0x0301) == CharClass::kMark);
  CHECK(charClassOf('7') == CharClass::kNumber);
  CHECK(charClassOf(0x216B) == CharClass::kNumber);           // Ⅻ
  CHECK(charClassOf(' ') == CharClass::kSpace);
  CHECK(charClassOf(0x85) == CharClass::kSpace);
  CHECK(charClassOf(0x1C) == CharClass::kOther);
  CHECK(charClassOf(0x1F600) == CharClass::kOther);           // 😀
  CHECK(charClassOf(0x105C0) == CharClass::kOtherLetter);     // Todhri, new in Unicode 16.0
  CHECK(charClassOf(0x10400) == CharClass::kUppercaseLetter); // Deseret, beyond the flat table
  CHECK(charClassOf(0x10FFFF) == CharClass::kOther);
  CHECK(charClassOf(0x110000) == CharClass::kOther);
}

TEST_CASE("UTF-8: ill-formed sequences become one U+FFFD per maximal subpart", "[hf_tokenizer]") {
  using utf8::toValidLossy;
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(toValidLossy("plain \u00E9") == "plain \u00E9");
  CHECK(toValidLossy("\xE4\xB8") == fffd);               // a cut character: one replacement
  CHECK(toValidLossy("\xE4\xB8x") == fffd + "x");
  CHECK(toValidLossy("\x80\x80") == fffd + fffd);         // stray continuation bytes: one each
  CHECK(toValidLossy("\xE0\x80") == fffd + fffd);         // E0 needs A0..BF next (no overlong forms)
  CHECK(toValidLossy("\xED\xA0\x80") == fffd + fffd + fffd);  // a surrogate
  CHECK(toValidLossy("\xF4\x90\x80\x80") == fffd + fffd + fffd + fffd);  // above U+10FFFF
  CHECK(toValidLossy("\xC0\xAF") == fffd + fffd);
  CHECK(utf8::firstInvalidOffset("ab\xC3(") == 2);
  CHECK(utf8::firstInvalidOffset("ab\u00E9") == std::string::npos);
}

TEST_CASE("UTF-8: an incomplete tail is what more bytes could complete", "[hf_tokenizer]") {
  using utf8::incompleteTailLength;
  CHECK(incompleteTailLength("") == 0);
  CHECK(incompleteTailLength("abc") == 0);
  CHECK(incompleteTailLength("a\xE4") == 1);
  CHECK(incompleteTailLength("a\xE4\xB8") == 2);
  CHECK(incompleteTailLength("a\xE4\xB8\xAD") == 0);
  CHECK(incompleteTailLength("\xF0\x9F\x98") == 3);
  CHECK(incompleteTailLength("\xE0\x80") == 0);  // already ill-formed: nothing will complete it
  CHECK(incompleteTailLength("\x80") == 0);
}
