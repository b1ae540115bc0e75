#include "worker/data/byte_tokenizer.h"

#include "tests/catch.h"

using namespace loom::data;

TEST_CASE("the byte tokenizer round-trips UTF-8 and shows document ends", "[data]") {
  const std::string text = "Grüße, 世界! 🙂\n";
  std::vector<uint32_t> tokens = encodeBytes(text);
  REQUIRE(tokens.size() == text.size());  // one token per byte, not per character
  CHECK(tokens[0] == 'G');
  CHECK(tokens[2] == 0xC3);  // ü is 0xC3 0xBC
  CHECK(tokens[3] == 0xBC);

  std::vector<int64_t> ids(tokens.begin(), tokens.end());
  CHECK(decodeBytes(ids) == text);
  ids.push_back(kByteEosToken);
  ids.push_back('x');
  CHECK(decodeBytes(ids) == text + "\n<|eos|>\nx");
  CHECK(decodeBytes({'a', 257, -1, 'b'}) == "a\xEF\xBF\xBD\xEF\xBF\xBD" "b");
  CHECK(encodeBytes("").empty());
  CHECK(kByteVocabSize == 257);
}
