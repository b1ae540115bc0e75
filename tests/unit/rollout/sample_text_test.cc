#include "worker/rollout/sample_text.h"

#include <nlohmann/json.hpp>

#include "tests/catch.h"
#include "worker/data/byte_level.h"

using namespace loom;
using nlohmann::json;

namespace {

// A byte-level tokenizer without merges: token b is byte b; 256 is the special <|eos|>.
data::HfTokenizer bytesTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[data::toByteLevel(std::string(1, static_cast<char>(b)))] = b;
  const json byteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({{{"id", 256}, {"content", "<|eos|>"}, {"single_word", false}, {"lstrip", false},
                                     {"rstrip", false}, {"normalized", false}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", byteLevel},
      {"post_processor", nullptr},
      {"decoder", byteLevel},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", json::array()}}}};
  auto t = data::HfTokenizer::fromJson(j.dump(), "tokenizer.json");
  REQUIRE(t.isOk());
  return std::move(*t);
}

// Appends the bytes of `text` one token each; the index of the token that stopped it, or -1.
int appendBytes(rollout::SampleText& s, const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i)
    if (s.append(static_cast<unsigned char>(text[i]))) return static_cast<int>(i);
  return -1;
}

}  // namespace

TEST_CASE("sample text: decoded as tokens arrive, a stop string ends it and is left out", "[rollout]") {
  const data::HfTokenizer tokenizer = bytesTokenizer();
  rollout::SampleText plain(tokenizer, {});
  CHECK(appendBytes(plain, "hello world") == -1);
  CHECK(plain.finish() == "hello world");

  // The stop string straddles text decoded by earlier tokens; the token completing it stops.
  rollout::SampleText stopped(tokenizer, {"lo w", "zzz"});
  CHECK(appendBytes(stopped, "hello world") == 6);
  CHECK(stopped.finish() == "hel");

  // A character split over two tokens waits for its second byte; a special token is skipped.
  rollout::SampleText accents(tokenizer, {"\xc3\xa9t"});
  CHECK(!accents.append(0xc3));
  CHECK(accents.text().empty());
  CHECK(!accents.append(256));
  CHECK(!accents.append(0xa9));
  CHECK(accents.text() == "\xc3\xa9");
  CHECK(accents.append('t'));
  CHECK(accents.finish().empty());

  // A character cut off at the end becomes U+FFFD, as the tokenizer's decode makes it.
  rollout::SampleText cut(tokenizer, {});
  CHECK(!cut.append('a'));
  CHECK(!cut.append(0xc3));
  CHECK(cut.finish() == "a\xef\xbf\xbd");
}

TEST_CASE("sample text: what a stream may send is what no stop string can still cut", "[rollout]") {
  const data::HfTokenizer tokenizer = bytesTokenizer();
  rollout::SampleText none(tokenizer, {});
  appendBytes(none, "abc");
  CHECK(none.settledSize() == 3);

  // "END" may still come: its first two bytes wait.
  rollout::SampleText s(tokenizer, {"END"});
  appendBytes(s, "abcE");
  CHECK(s.settledSize() == 2);
  appendBytes(s, "N");
  CHECK(s.settledSize() == 3);
  CHECK(s.append('D'));
  CHECK(s.text() == "abc");
  CHECK(s.settledSize() == 3);

  // Held back at a character's first byte, never inside it.
  rollout::SampleText accents(tokenizer, {"xyz"});
  appendBytes(accents, "a\xc3\xa9" "b");
  CHECK(accents.text() == "a\xc3\xa9" "b");
  CHECK(accents.settledSize() == 1);
  accents.finish();
  CHECK(accents.settledSize() == accents.text().size());
}
