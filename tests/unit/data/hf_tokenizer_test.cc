#include "worker/data/hf_tokenizer.h"

#include <functional>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"
#include "worker/data/byte_level.h"
#include "worker/data/prepare.h"
#include "worker/data/token_file.h"

using namespace loom;
using namespace loom::data;
using nlohmann::json;

namespace {

using Ids = std::vector<uint32_t>;

std::string byteChar(int b) { return toByteLevel(std::string(1, static_cast<char>(b))); }

// A byte-level BPE small enough to follow by hand: the 256 byte-level characters, each with its
// byte's value as id; merges that build "hello" (261) and " the" (258, "Ġthe"); "Ġhel" (262),
// which no merge builds; special tokens <|bos|> (263) and <|eos|> (264), and <sep> (265), a plain
// added token that takes the white space around it. GPT-2's pre-tokenizer, a template that puts
// <|bos|> first. The expected ids below are the `tokenizers` package's for this file.
json tinyTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byteChar(b)] = b;
  json merges = json::array();
  uint32_t next = 256;
  for (auto [left, right] : std::vector<std::pair<std::string, std::string>>{
           {"h", "e"}, {"Ġ", "t"}, {"Ġt", "he"}, {"l", "l"}, {"ll", "o"}, {"he", "llo"}}) {
    vocab[left + right] = next++;
    merges.push_back(json::array({left, right}));
  }
  vocab["Ġhel"] = 262;
  auto added = [](int id, const char* content, bool special, bool strip) {
    return json{{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", strip},
                {"rstrip", strip},  {"normalized", false}, {"special", special}};
  };
  auto byteLevel = [](bool regex) {
    return json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", regex}};
  };
  json bos = {{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}};
  json bosIds = {{"id", "<|bos|>"}, {"ids", json::array({263})}, {"tokens", json::array({"<|bos|>"})}};
  json textA = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  json textB = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array({added(263, "<|bos|>", true, false), added(264, "<|eos|>", true, false),
                                        added(265, "<sep>", false, true)})},
          {"normalizer", nullptr},
          {"pre_tokenizer", byteLevel(true)},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", json::array({bos, textA})},
            {"pair", json::array({bos, textA, textB})},
            {"special_tokens", {{"<|bos|>", bosIds}}}}},
          {"decoder", byteLevel(true)},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

// Llama 3's pre-tokenizer and NFC over the same model.
json tinyLlama3Tokenizer() {
  json j = tinyTokenizer();
  j["normalizer"] = {{"type", "NFC"}};
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", std::string(regexOf(SplitPattern::kLlama3))}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json byteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({split, byteLevel})}};
  return j;
}

HfTokenizer fromJson(const json& j) {
  auto t = HfTokenizer::fromJson(j.dump(), "tokenizer.json");
  INFO(t.status().toString());
  REQUIRE(t.isOk());
  return std::move(t).value();
}

std::string loadError(const json& j) {
  auto t = HfTokenizer::fromJson(j.dump(), "tokenizer.json");
  REQUIRE(!t.isOk());
  CHECK(t.status().code() == StatusCode::kInvalidArgument);
  return t.status().message();
}

// A tokenizer directory: tokenizer.json, and the config files given (not written when empty).
std::string writeTokenizerDir(const testing::TempDir& dir, const std::string& name, const json& tokenizer,
                              const json& tokenizerConfig = nullptr, const json& generationConfig = nullptr) {
  const std::string path = dir.path() + "/" + name;
  REQUIRE(files::makeDirs(path).isOk());
  REQUIRE(files::writeFileAtomic(path + "/tokenizer.json", tokenizer.dump()).isOk());
  if (!tokenizerConfig.is_null())
    REQUIRE(files::writeFileAtomic(path + "/tokenizer_config.json", tokenizerConfig.dump()).isOk());
  if (!generationConfig.is_null())
    REQUIRE(files::writeFileAtomic(path + "/generation_config.json", generationConfig.dump()).isOk());
  return path;
}

}  // namespace

TEST_CASE("hf tokenizer: BPE merges by rank, added tokens split out first, the template on request", "[hf_tokenizer]") {
  const HfTokenizer t = fromJson(tinyTokenizer());
  CHECK(t.vocabSize() == 266);
  CHECK(t.encode("hello the") == Ids{261, 258});
  CHECK(t.encode("the") == Ids{116, 256});      // "t he": no merge joins them without the space
  CHECK(t.encode(" hel") == Ids{32, 256, 108});  // "Ġhel" is in the vocabulary, but no merge makes it
  CHECK(t.encode("\u00E9") == Ids{0xC3, 0xA9});  // one token per byte where nothing merges
  CHECK(t.encode("<|bos|>hello<|eos|>") == Ids{263, 261, 264});
  CHECK(t.encode("<|bos|hello") == Ids{'<', '|', 'b', 'o', 's', '|', 261});
  CHECK(t.encode("a <sep>  b") == Ids{'a', 265, 'b'});  // <sep> takes the spaces around it
  CHECK(t.encode("hello", {.addSpecialTokens = true}) == Ids{263, 261});
  CHECK(t.encode("").empty());
  CHECK(t.tokenId("<|eos|>") == 264u);
  CHECK(t.tokenId("Ġthe") == 258u);
  CHECK(!t.tokenId("nope").has_value());
  CHECK(t.eosTokenIds().empty());  // tokenizer.json alone names none
}

TEST_CASE("hf tokenizer: ignore_merges, add_prefix_space and merges written \"left right\"", "[hf_tokenizer]") {
  json j = tinyTokenizer();
  j["model"]["ignore_merges"] = true;
  CHECK(fromJson(j).encode(" hel") == Ids{262});  // a pre-token in the vocabulary is one token
  CHECK(fromJson(j).encode("hello the") == Ids{261, 258});

  j = tinyTokenizer();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  CHECK(fromJson(j).encode("the") == Ids{258});
  CHECK(fromJson(j).encode("<|bos|>the") == Ids{263, 258});  // each stretch between added tokens gets one

  j = tinyTokenizer();
  json legacy = json::array();
  for (const auto& m : j["model"]["merges"]) legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  j["model"]["merges"] = legacy;
  CHECK(fromJson(j).encode("hello the") == Ids{261, 258});
}

TEST_CASE("hf tokenizer: NFC before Llama 3's split", "[hf_tokenizer]") {
  const HfTokenizer t = fromJson(tinyLlama3Tokenizer());
  const Ids composed{'c', 'a', 'f', 0xC3, 0xA9};
  CHECK(t.encode("caf\u00E9") == composed);
  CHECK(t.encode("cafe\u0301") == composed);
  CHECK(t.encode("hello the") == Ids{261, 258});
  CHECK(t.encode("I'M") == Ids{'I', '\'', 'M'});
}

TEST_CASE("hf tokenizer: decode, skipping special tokens, cut characters as U+FFFD", "[hf_tokenizer]") {
  const HfTokenizer t = fromJson(tinyTokenizer());
  const Ids ids{263, 261, 258, 264};
  CHECK(t.decode(ids) == "<|bos|>hello the<|eos|>");
  CHECK(t.decode(ids, true) == "hello the");
  CHECK(t.decode(Ids{'a', 265, 'b'}) == "a<sep>b");  // a plain added token is kept
  CHECK(t.decode(Ids{'a', 265, 'b'}, true) == "a<sep>b");
  CHECK(t.decode(Ids{0xC3, 0xA9}) == "\u00E9");
  CHECK(t.decode(Ids{261, 0xC3}) == "hello\uFFFD");
  CHECK(t.decode(Ids{0xC3, 'a'}) == "\uFFFDa");
  CHECK(t.decode(Ids{261, 9999, 266}) == "hello");  // ids without a token are skipped
  CHECK(t.decode(t.encode("naïve 中文 👍🏽\n\ttabs")) == "naïve 中文 👍🏽\n\ttabs");
}

TEST_CASE("hf tokenizer: incremental decode emits whole characters only", "[hf_tokenizer]") {
  const HfTokenizer t = fromJson(tinyTokenizer());
  const Ids ids = t.encode("hi \u4E2D!");  // 中 is E4 B8 AD: three tokens
  REQUIRE(ids == Ids{'h', 'i', 32, 0xE4, 0xB8, 0xAD, '!'});
  std::vector<std::string> pieces;
  size_t emitted = 0;
  for (size_t n = 1; n <= ids.size(); ++n) {
    DecodedText next = t.decodeIncrementally(std::span(ids.data(), n), emitted, false);
    pieces.push_back(next.text);
    emitted = next.emittedTokens;
  }
  CHECK(pieces == std::vector<std::string>{"h", "i", " ", "", "", "\u4E2D", "!"});
  CHECK(emitted == ids.size());

  // A special token is text like any other, or nothing when skipped.
  const Ids special{261, 264};
  CHECK(t.decodeIncrementally(special, 1, false).text == "<|eos|>");
  CHECK(t.decodeIncrementally(special, 1, true).text == "");
  CHECK(t.decodeIncrementally(special, 1, true).emittedTokens == 2);
  // The end of a generation cut inside a character: held back, then U+FFFD when final.
  const Ids cut{'h', 0xE4, 0xB8};
  CHECK(t.decodeIncrementally(cut, 1, false).text == "");
  CHECK(t.decodeIncrementally(cut, 1, false).emittedTokens == 1);
  CHECK(t.decodeIncrementally(cut, 1, false, true).text == "\uFFFD");
  CHECK(t.decodeIncrementally(cut, 0, false, true).emittedTokens == 3);
}

TEST_CASE("hf tokenizer: what is not implemented is refused, naming the field", "[hf_tokenizer]") {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["model"]["type"] = "WordPiece"; }, "tokenizer.json: model.type: \"WordPiece\" is not supported"},
      {[](json& j) { j["model"].erase("type"); }, "tokenizer.json: model.type: missing"},
      {[](json& j) { j["model"]["byte_fallback"] = true; },
       "tokenizer.json: model.byte_fallback: true is not supported"},
      {[](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout: 0.1 is not supported"},
      {[](json& j) { j["model"]["unk_token"] = "<unk>"; }, "model.unk_token: \"<unk>\" is not supported"},
      {[](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "model.continuing_subword_prefix: \"##\""},
      {[](json& j) { j["model"]["merges"][1] = "he"; },
       "tokenizer.json: model.merges[1]: must be \"left right\" or [\"left\", \"right\"], got \"he\""},
      {[](json& j) { j["model"]["merges"][2] = "a b c"; }, "model.merges[2]: must be \"left right\""},
      {[](json& j) { j["model"]["merges"][0] = json::array({"h"}); }, "model.merges[0]: must be \"left right\""},
      {[](json& j) { j["model"]["merges"][0] = json::array({"h", "zz"}); },
       "model.merges[0]: \"zz\" is not in the vocab"},
      {[](json& j) { j["model"]["vocab"]["x"] = -1; }, "model.vocab[\"x\"]: must be a token id"},
      {[](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer: null is not supported"},
      {[](json& j) { j["pre_tokenizer"]["type"] = "Metaspace"; }, "pre_tokenizer.type: \"Metaspace\" is not supported"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\d+"; },
       "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: unknown pattern \"\\d+\""},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}}; },
       "pre_tokenizer.pretokenizers[0].pattern: {\"String\":\" \"} is not supported"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pre_tokenizer.pretokenizers[0].behavior: \"Removed\" is not supported"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "pre_tokenizer.pretokenizers[0].invert: true is not supported"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); },
       "pre_tokenizer.pretokenizers: must end in ByteLevel"},
      {[](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer.type: \"NFKC\" is not supported"},
      {[](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; },
       "post_processor.type: \"RobertaProcessing\" is not supported"},
      {[](json& j) { j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<none>"; },
       "post_processor.special_tokens.<none>.ids: must be the ids of special token \"<none>\""},
      {[](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder.type: \"WordPiece\" is not supported"},
      {[](json& j) { j["decoder"] = nullptr; }, "decoder: null is not supported"},
      {[](json& j) { j["added_tokens"][0]["single_word"] = true; },
       "added_tokens[0].single_word: true is not supported"},
      {[](json& j) { j["added_tokens"][1]["content"] = ""; }, "added_tokens[1].content: must not be empty"},
      {[](json& j) { j["truncation"] = {{"max_length", 8}}; }, "truncation: {\"max_length\":8} is not supported"},
      // `tokenizers` would give <|eos|> id 264, whatever the file says.
      {[](json& j) { j["added_tokens"][1]["id"] = 300; },
       "added_tokens[1].id: 300 for \"<|eos|>\", but the tokenizers package gives it 264"},
  };
  for (const auto& [mutate, expected] : cases) {
    json j = tinyLlama3Tokenizer();
    mutate(j);
    const std::string message = loadError(j);
    INFO(message);
    CHECK(message.find(expected) != std::string::npos);
  }
  const std::string truncated = HfTokenizer::fromJson("{\"model\": ", "tokenizer.json").status().message();
  CHECK(truncated.find("tokenizer.json: not valid JSON") == 0);
}

TEST_CASE("hf tokenizer: load reads the directory's files, naming the file in errors", "[hf_tokenizer]") {
  testing::TempDir dir;
  const std::string plain = writeTokenizerDir(dir, "plain", tinyTokenizer(),
                                              json{{"eos_token", {{"content", "<|eos|>"}}}, {"bos_token", "<|bos|>"}},
                                              json{{"eos_token_id", json::array({263, 264})}});
  auto t = HfTokenizer::load(plain);
  INFO(t.status().toString());
  REQUIRE(t.isOk());
  CHECK(t->eosTokenIds() == Ids{264, 263});  // tokenizer_config.json's first, then generation_config.json's
  CHECK(t->bosTokenId() == 263u);
  CHECK(t->encode("hello") == Ids{261});

  const std::string generationOnly =
      writeTokenizerDir(dir, "generation", tinyTokenizer(), nullptr, json{{"eos_token_id", 264}});
  CHECK(HfTokenizer::load(generationOnly)->eosTokenIds() == Ids{264});

  auto errorOf = [](const std::string& directory) {
    auto result = HfTokenizer::load(directory);
    REQUIRE(!result.isOk());
    return result.status().message();
  };
  CHECK(errorOf(dir.path() + "/missing") ==
        dir.path() + "/missing: not a directory (a tokenizer is a directory holding tokenizer.json)");
  REQUIRE(files::makeDirs(dir.path() + "/empty").isOk());
  CHECK(errorOf(dir.path() + "/empty").find(dir.path() + "/empty/tokenizer.json: no such file") == 0);
  const std::string badEos = writeTokenizerDir(dir, "bad-eos", tinyTokenizer(), json{{"eos_token", "<nope>"}});
  CHECK(errorOf(badEos) == badEos + "/tokenizer_config.json: eos_token: \"<nope>\" is not a token of tokenizer.json");
  const std::string badId = writeTokenizerDir(dir, "bad-id", tinyTokenizer(), nullptr, json{{"eos_token_id", 266}});
  CHECK(errorOf(badId).find(badId + "/generation_config.json: eos_token_id: must be a token id") == 0);
  json wrongType = tinyTokenizer();
  wrongType["model"]["type"] = "Unigram";
  const std::string unigram = writeTokenizerDir(dir, "unigram", wrongType);
  CHECK(errorOf(unigram).find(unigram + "/tokenizer.json: model.type: \"Unigram\" is not supported") == 0);
}

TEST_CASE("prepare with a Hugging Face tokenizer: its ids, its eos, its vocabulary size", "[hf_tokenizer]") {
  testing::TempDir dir;
  const std::string tokenizer = writeTokenizerDir(dir, "tiny", tinyTokenizer(), json{{"eos_token", "<|eos|>"}});
  const std::string docs = dir.path() + "/docs.jsonl";
  const std::string lines = "{\"text\": \"hello the\"}\n{\"text\": \"  \"}\n{\"text\": \"<|bos|>the\"}\n";
  REQUIRE(files::writeFileAtomic(docs, lines).isOk());
  const std::string out = dir.path() + "/out.tokens";
  auto header = prepareTokenFile({.inputs = {docs}, .output = out, .tokenizer = tokenizer});
  INFO(header.status().toString());
  REQUIRE(header.isOk());
  CHECK(header->tokenizer == "hf:" + tokenizer);
  CHECK(header->vocabSize == 266);
  CHECK(header->dtype == "uint16");
  CHECK(header->eosTokenId == 264);
  CHECK(header->documentStarts == std::vector<int64_t>{0, 3});
  auto file = TokenFile::open(out);
  REQUIRE(file.isOk());
  std::vector<int64_t> tokens(static_cast<size_t>(file->size()));
  file->read(0, file->size(), tokens.data());
  CHECK(tokens == std::vector<int64_t>{261, 258, 264, 263, 116, 256, 264});  // no template: <|bos|> only where written

  // A vocabulary past 65536 ids needs uint32.
  json large = tinyTokenizer();
  for (uint32_t id = 263; id < 70000; ++id) large["model"]["vocab"]["<filler " + std::to_string(id) + ">"] = id;
  large["added_tokens"] = json::array({{{"id", 70000}, {"content", "<|far|>"}, {"special", true}}});
  large["post_processor"] = nullptr;
  const std::string wide = writeTokenizerDir(dir, "wide", large, json{{"eos_token", "<|far|>"}});
  header = prepareTokenFile({.inputs = {docs}, .output = out, .tokenizer = wide});
  INFO(header.status().toString());
  REQUIRE(header.isOk());
  CHECK(header->dtype == "uint32");
  CHECK(header->vocabSize == 70001);
  CHECK(header->eosTokenId == 70000);

  const std::string noEos = writeTokenizerDir(dir, "no-eos", tinyTokenizer());
  header = prepareTokenFile({.inputs = {docs}, .output = out, .tokenizer = noEos});
  REQUIRE(!header.isOk());
  CHECK(header.status().message().find(noEos + ": no end-of-document token") == 0);

  const std::string latin1 = dir.path() + "/latin1.txt";
  REQUIRE(files::writeFileAtomic(latin1, "caf\xE9 au lait").isOk());
  header = prepareTokenFile({.inputs = {latin1}, .output = out, .tokenizer = tokenizer});
  REQUIRE(!header.isOk());
  CHECK(header.status().message() == latin1 + ": not valid UTF-8 at byte 3: a Hugging Face tokenizer reads UTF-8 text");
}
