#include "worker/data/token_file.h"

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using namespace loom::data;

namespace {

std::vector<int64_t> readAll(const TokenFile& file) {
  std::vector<int64_t> out(static_cast<size_t>(file.size()));
  file.read(0, file.size(), out.data());
  return out;
}

// A file with the given header text and `tokenBytes` bytes of tokens, laid out as the format says.
std::string rawTokenFile(const std::string& header, size_t tokenBytes, const char* magic = "LOOMTOK1") {
  std::string bytes(magic, 8);
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(length >> (8 * i)));
  bytes += header;
  bytes.resize((bytes.size() + 63) / 64 * 64, '\0');
  bytes.append(tokenBytes, '\0');
  return bytes;
}

const char* kGoodHeader = R"({"format_version": 1, "dtype": "uint16", "vocab_size": 257, "num_tokens": 4,
  "tokenizer": "bytes", "eos_token_id": 256, "document_starts": [0, 2]})";

// The message open() gives for a file of `content`, with the file's path replaced by "FILE".
std::string openError(const testing::TempDir& dir, const std::string& content) {
  std::string path = dir.path() + "/bad.tokens";
  REQUIRE(files::writeFileAtomic(path, content).isOk());
  auto file = TokenFile::open(path);
  REQUIRE_FALSE(file.isOk());
  CHECK(file.status().code() == StatusCode::kInvalidArgument);
  std::string message = file.status().message();
  REQUIRE(message.rfind(path + ": ", 0) == 0);
  return "FILE" + message.substr(path.size());
}

std::string withKey(const std::string& key, const std::string& value) {
  auto j = nlohmann::json::parse(kGoodHeader);
  j[key] = nlohmann::json::parse(value);
  return j.dump();
}

std::string withoutKey(const std::string& key) {
  auto j = nlohmann::json::parse(kGoodHeader);
  j.erase(key);
  return j.dump();
}

}  // namespace

TEST_CASE("uint16 and uint32 token files round-trip header and tokens", "[data]") {
  testing::TempDir dir;
  std::string dtype = GENERATE("uint16", "uint32");
  const int64_t vocab = dtype == "uint16" ? 65536 : 200000;
  std::vector<uint32_t> tokens = {0, 1, 255, 256, 65535, static_cast<uint32_t>(vocab - 1), 7};
  TokenFileHeader header{.dtype = dtype, .vocabSize = vocab, .tokenizer = "test", .eosTokenId = 7,
                         .documentStarts = {0, 3, 6}};
  std::string path = dir.path() + "/corpus.tokens";
  REQUIRE(writeTokenFile(path, header, tokens).isOk());

  auto file = TokenFile::open(path);
  INFO(file.status().toString());
  REQUIRE(file.isOk());
  CHECK(file->path() == path);
  CHECK(file->size() == 7);
  CHECK(file->header().formatVersion == 1);
  CHECK(file->header().dtype == dtype);
  CHECK(file->header().vocabSize == vocab);
  CHECK(file->header().numTokens == 7);
  CHECK(file->header().tokenizer == "test");
  CHECK(file->header().eosTokenId == 7);
  CHECK(file->header().documentStarts == std::vector<int64_t>{0, 3, 6});
  CHECK(readAll(*file) == std::vector<int64_t>(tokens.begin(), tokens.end()));
  int64_t middle[3] = {};
  file->read(2, 3, middle);
  CHECK(std::vector<int64_t>(middle, middle + 3) == std::vector<int64_t>{255, 256, 65535});

  // The layout others read without this code: magic, little-endian header length, tokens at 64.
  std::string raw = files::readFile(path).value();
  CHECK(raw.substr(0, 8) == "LOOMTOK1");
  uint64_t headerBytes = 0;
  std::memcpy(&headerBytes, raw.data() + 8, 8);
  auto json = nlohmann::json::parse(raw.substr(16, headerBytes));
  CHECK(json["dtype"] == dtype);
  CHECK(json["num_tokens"] == 7);
  const size_t dataOffset = (16 + headerBytes + 63) / 64 * 64;
  const size_t width = dtype == "uint16" ? 2 : 4;
  CHECK(raw.size() == dataOffset + 7 * width);
  CHECK(static_cast<unsigned char>(raw[dataOffset + 2 * width]) == 255);
  CHECK(static_cast<unsigned char>(raw[dataOffset + 3 * width + 1]) == 1);  // 256, little-endian

  // A moved-from file gives up its mapping; the new owner reads on.
  TokenFile moved = std::move(*file);
  CHECK(readAll(moved).back() == 7);
  CHECK(files::listFiles(dir.path()) == std::vector<std::string>{path});  // no temporary left
}

TEST_CASE("an empty token file is valid", "[data]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/empty.tokens";
  REQUIRE(writeTokenFile(path, {.vocabSize = 10}, {}).isOk());
  auto file = TokenFile::open(path);
  REQUIRE(file.isOk());
  CHECK(file->size() == 0);
  CHECK(file->header().documentStarts.empty());
}

TEST_CASE("writing refuses tokens that do not fit the dtype or the vocabulary, and bad headers", "[data]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/out.tokens";
  CHECK(writeTokenFile(path, {.vocabSize = 100, .documentStarts = {0}}, {1, 100, 2}).message() ==
        path + ": tokens[1] = 100 is not below vocab_size 100");
  CHECK(writeTokenFile(path, {.dtype = "uint32", .vocabSize = 70000, .documentStarts = {0}}, {1, 70000}).message() ==
        path + ": tokens[1] = 70000 is not below vocab_size 70000");
  CHECK(writeTokenFile(path, {.vocabSize = 70000, .documentStarts = {0}}, {1}).message() ==
        path + ": vocab_size: must be between 1 and 65536 for dtype uint16, got 70000");
  CHECK(writeTokenFile(path, {.dtype = "int8", .vocabSize = 10, .documentStarts = {0}}, {1}).message() ==
        path + ": dtype: unknown \"int8\" (uint16 or uint32)");
  CHECK(writeTokenFile(path, {.vocabSize = 10, .documentStarts = {0, 5}}, {1, 2}).message() ==
        path + ": document_starts[1]: 5 is out of range (num_tokens 2)");
  CHECK(writeTokenFile(path, {.vocabSize = 10}, {1, 2}).message() ==
        path + ": document_starts: is empty, but num_tokens is 2 (the first document starts at 0)");
  CHECK(writeTokenFile(path, {.vocabSize = 10, .eosTokenId = 10, .documentStarts = {0}}, {1}).message() ==
        path + ": eos_token_id: must be -1 (none) or below vocab_size 10, got 10");
  CHECK_FALSE(files::exists(path));
  CHECK(files::listFiles(dir.path()).empty());

  Status noDir = writeTokenFile(dir.path() + "/missing/out.tokens", {.vocabSize = 10, .documentStarts = {0}}, {1});
  CHECK(noDir.message().find(dir.path() + "/missing/out.tokens") != std::string::npos);
}

TEST_CASE("open names the file and what is wrong with it", "[data]") {
  testing::TempDir dir;
  // The fixture itself is good.
  REQUIRE(files::writeFileAtomic(dir.path() + "/good.tokens", rawTokenFile(kGoodHeader, 8)).isOk());
  REQUIRE(TokenFile::open(dir.path() + "/good.tokens").isOk());

  auto missing = TokenFile::open(dir.path() + "/absent.tokens");
  CHECK(missing.status().message() == dir.path() + "/absent.tokens: cannot open: No such file or directory");

  CHECK(openError(dir, "LOOM") == "FILE: not a Loom token file (only 4 bytes)");
  CHECK(openError(dir, rawTokenFile(kGoodHeader, 8, "GGUF\3\0\0\0")) ==
        "FILE: not a Loom token file (it does not start with \"LOOMTOK1\")");
  std::string truncatedHeader = rawTokenFile(kGoodHeader, 0).substr(0, 40);
  CHECK(openError(dir, truncatedHeader) ==
        fmt::format("FILE: the header length {} runs past the end of the file (40 bytes)", std::strlen(kGoodHeader)));
  CHECK(openError(dir, rawTokenFile("{\"format_version\": 1,", 8)).rfind("FILE: header is not valid JSON: ", 0) == 0);
  CHECK(openError(dir, rawTokenFile("[1, 2]", 8)) == "FILE: header must be a JSON object, got array");

  CHECK(openError(dir, rawTokenFile(withKey("format_version", "2"), 8)) ==
        "FILE: format_version 2 is not supported (this build reads 1)");
  CHECK(openError(dir, rawTokenFile(withKey("dtype", "\"float32\""), 8)) ==
        "FILE: dtype: unknown \"float32\" (uint16 or uint32)");
  for (const char* key :
       {"format_version", "dtype", "vocab_size", "num_tokens", "tokenizer", "eos_token_id", "document_starts"}) {
    CHECK(openError(dir, rawTokenFile(withoutKey(key), 8)) == fmt::format("FILE: {}: required key is missing", key));
  }
  CHECK(openError(dir, rawTokenFile(withKey("vocab_size", "\"257\""), 8)) ==
        "FILE: vocab_size: must be an integer, got string");
  CHECK(openError(dir, rawTokenFile(withKey("num_tokens", "4.5"), 8)) ==
        "FILE: num_tokens: must be an integer, got number");
  CHECK(openError(dir, rawTokenFile(withKey("tokenizer", "7"), 8)) == "FILE: tokenizer: must be a string, got number");
  CHECK(openError(dir, rawTokenFile(withKey("document_starts", "{}"), 8)) ==
        "FILE: document_starts: must be an array, got object");
  CHECK(openError(dir, rawTokenFile(withKey("document_starts", "[0, \"2\"]"), 8)) ==
        "FILE: document_starts[1]: must be an integer, got string");

  CHECK(openError(dir, rawTokenFile(withKey("document_starts", "[0, 3, 2]"), 8)) ==
        "FILE: document_starts[2]: 2 is not after document_starts[1] = 3 (must be ascending)");
  CHECK(openError(dir, rawTokenFile(withKey("document_starts", "[0, 4]"), 8)) ==
        "FILE: document_starts[1]: 4 is out of range (num_tokens 4)");
  CHECK(openError(dir, rawTokenFile(withKey("document_starts", "[1, 2]"), 8)) ==
        "FILE: document_starts[0]: must be 0, got 1");

  // kGoodHeader is 148 bytes: the tokens start at 192.
  REQUIRE(std::strlen(kGoodHeader) + 16 <= 192);
  REQUIRE(std::strlen(kGoodHeader) + 16 > 128);
  CHECK(openError(dir, rawTokenFile(kGoodHeader, 6)) ==
        "FILE: the file is 198 bytes, expected 200 (4 uint16 tokens from offset 192); truncated or not written "
        "completely?");
  CHECK(openError(dir, rawTokenFile(withKey("dtype", "\"uint32\""), 8)).rfind("FILE: the file is ", 0) == 0);
}
