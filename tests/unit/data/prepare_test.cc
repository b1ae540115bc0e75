#include "worker/data/prepare.h"

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"
#include "worker/data/byte_tokenizer.h"

using namespace loom;
using namespace loom::data;

namespace {

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& content) {
  std::string path = dir.path() + "/" + name;
  REQUIRE(files::writeFileAtomic(path, content).isOk());
  return path;
}

// The output file's tokens as text, documents ending in "\n<|eos|>\n".
std::string decodedOutput(const std::string& path) {
  auto file = TokenFile::open(path);
  INFO(file.status().toString());
  REQUIRE(file.isOk());
  std::vector<int64_t> tokens(static_cast<size_t>(file->size()));
  file->read(0, file->size(), tokens.data());
  return decodeBytes(tokens);
}

TokenFileHeader prepare(const PrepareOptions& options) {
  auto header = prepareTokenFile(options);
  INFO(header.status().toString());
  REQUIRE(header.isOk());
  return *header;
}

}  // namespace

TEST_CASE("prepare: text split at separator lines, blank documents skipped", "[data]") {
  testing::TempDir dir;
  std::string fortunes = write(dir, "fortunes", "first\nquote\n%\nsecond\n%\n%\n  \n%\r\nthird");
  std::string out = dir.path() + "/fortunes.tokens";
  TokenFileHeader header = prepare({.inputs = {fortunes}, .output = out, .separator = "%"});

  CHECK(header.documentStarts == std::vector<int64_t>{0, 13, 21});
  CHECK(header.numTokens == 27);
  CHECK(header.vocabSize == 257);
  CHECK(header.dtype == "uint16");
  CHECK(header.tokenizer == "bytes");
  CHECK(header.eosTokenId == 256);
  CHECK(decodedOutput(out) == "first\nquote\n\n<|eos|>\nsecond\n\n<|eos|>\nthird\n<|eos|>\n");
  auto file = TokenFile::open(out);
  REQUIRE(file.isOk());
  CHECK(file->header().documentStarts == header.documentStarts);
}

TEST_CASE("prepare: without a separator each text file is one document, non-ASCII kept", "[data]") {
  testing::TempDir dir;
  std::string a = write(dir, "a.txt", "hello\n% not a separator\n");
  std::string empty = write(dir, "empty.txt", "");
  std::string b = write(dir, "b.md", "Grüße, 世界\n");
  std::string out = dir.path() + "/out.tokens";
  TokenFileHeader header = prepare({.inputs = {a, empty, b}, .output = out});
  CHECK(header.documentStarts.size() == 2);
  CHECK(decodedOutput(out) == "hello\n% not a separator\n\n<|eos|>\nGrüße, 世界\n\n<|eos|>\n");
}

TEST_CASE("prepare: jsonl takes one document per line from the text key", "[data]") {
  testing::TempDir dir;
  std::string jsonl = write(dir, "docs.jsonl",
                            "{\"text\": \"one\", \"id\": 1}\n"
                            "\n"
                            "{\"text\": \"\"}\n"
                            "{\"text\": \"two\\nlines \\u00e9\"}\r\n");
  std::string out = dir.path() + "/docs.tokens";
  TokenFileHeader header = prepare({.inputs = {jsonl}, .output = out});
  CHECK(header.documentStarts == std::vector<int64_t>{0, 4});
  CHECK(decodedOutput(out) == "one\n<|eos|>\ntwo\nlines é\n<|eos|>\n");

  // Another key; "auto" decides per file, "text" reads a .jsonl file as text.
  std::string other = write(dir, "other.json-lines", "{\"content\": \"x\"}\n");
  std::string notes = write(dir, "notes.txt", "{\"content\": \"y\"}");
  prepare({.inputs = {other, notes}, .output = out, .textKey = "content"});
  CHECK(decodedOutput(out) == "x\n<|eos|>\n{\"content\": \"y\"}\n<|eos|>\n");
  prepare({.inputs = {other}, .output = out, .format = "text"});
  CHECK(decodedOutput(out) == "{\"content\": \"x\"}\n\n<|eos|>\n");
  prepare({.inputs = {notes}, .output = out, .format = "jsonl", .textKey = "content"});
  CHECK(decodedOutput(out) == "y\n<|eos|>\n");
}

TEST_CASE("prepare: a bad jsonl line is named by file, line and key", "[data]") {
  testing::TempDir dir;
  std::string out = dir.path() + "/out.tokens";
  auto error = [&](const std::string& content) {
    std::string path = write(dir, "bad.jsonl", content);
    auto header = prepareTokenFile({.inputs = {path}, .output = out});
    REQUIRE_FALSE(header.isOk());
    CHECK(header.status().code() == StatusCode::kInvalidArgument);
    std::string message = header.status().message();
    REQUIRE(message.rfind(path, 0) == 0);
    return "FILE" + message.substr(path.size());
  };
  CHECK(error("{\"text\": \"a\"}\n\n{\"body\": \"b\"}\n") == "FILE:3: key \"text\" is missing");
  CHECK(error("{\"text\": 5}\n") == "FILE:1: key \"text\" must be a string, got number");
  CHECK(error("{\"text\": \"a\"}\n[\"a\"]\n") == "FILE:2: expected an object with a \"text\" string, got array");
  std::string notJson = error("{\"text\": \"a\"}\n{\"text\": \"b}\n");
  CHECK(notJson.rfind("FILE:2: not valid JSON (column ", 0) == 0);
  CHECK(notJson.find("expected an object with a \"text\" string") != std::string::npos);
  CHECK_FALSE(files::exists(out));  // nothing is written when an input is bad
}

TEST_CASE("prepare: missing inputs, directories, no documents and bad options are refused", "[data]") {
  testing::TempDir dir;
  std::string out = dir.path() + "/out.tokens";
  std::string good = write(dir, "good.txt", "text");
  auto message = [](const StatusOr<TokenFileHeader>& r) { return r.isOk() ? std::string("OK") : r.status().message(); };

  CHECK(message(prepareTokenFile({.inputs = {good, dir.path() + "/absent.txt"}, .output = out})) ==
        dir.path() + "/absent.txt: no such file");
  CHECK(message(prepareTokenFile({.inputs = {dir.path()}, .output = out})) ==
        dir.path() + ": is a directory; give the files in it");
  std::string blank = write(dir, "blank.txt", " \n\n");
  CHECK(message(prepareTokenFile({.inputs = {blank}, .output = out})) ==
        "no documents in the inputs: every one is empty or blank");
  CHECK(message(prepareTokenFile({.inputs = {good}, .output = out, .format = "csv"})) ==
        "format: must be auto, text or jsonl, got \"csv\"");
  CHECK(message(prepareTokenFile({.inputs = {}, .output = out})) == "inputs: at least one input file is required");
  CHECK(message(prepareTokenFile({.inputs = {good}})) == "output: required");
  CHECK(message(prepareTokenFile({.inputs = {good}, .output = dir.path() + "/no/out.tokens"})) ==
        dir.path() + "/no/out.tokens: the directory " + dir.path() + "/no does not exist");
  CHECK_FALSE(files::exists(out));
}
