#include "worker/data/prepare.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "worker/data/byte_tokenizer.h"
#include "worker/data/hf_tokenizer.h"
#include "worker/data/utf8.h"

namespace loom::data {

namespace {

using nlohmann::json;

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool isBlank(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos; }

// Calls f(line, offset of the line in text, line number from 1) for each line of `text`, without its '\n'.
template <typename F>
Status forEachLine(std::string_view text, F&& f) {
  size_t begin = 0;
  for (int64_t number = 1; begin < text.size(); ++number) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    RETURN_IF_ERROR(f(text.substr(begin, end - begin), begin, number));
    begin = end + 1;
  }
  return Status::ok();
}

// How a document becomes ids: the byte tokenizer, or a Hugging Face tokenizer (options.tokenizer).
class DocumentEncoder {
 public:
  static StatusOr<DocumentEncoder> open(const std::string& tokenizerDir) {
    DocumentEncoder e;
    if (tokenizerDir.empty()) return e;
    ASSIGN_OR_RETURN(HfTokenizer hf, HfTokenizer::load(tokenizerDir));
    if (hf.eosTokenIds().empty())
      return invalidArgument("{}: no end-of-document token: tokenizer_config.json names no eos_token and "
                             "generation_config.json no eos_token_id",
                             tokenizerDir);
    e.eosTokenId_ = hf.eosTokenIds().front();
    e.vocabSize_ = hf.vocabSize();
    // The absolute path: the token file may be read from another directory.
    std::filesystem::path path = std::filesystem::absolute(tokenizerDir).lexically_normal();
    if (!path.has_filename()) path = path.parent_path();  // "dir/" names the same directory as "dir"
    e.name_ = "hf:" + path.string();
    e.hf_ = std::make_shared<HfTokenizer>(std::move(hf));
    return e;
  }

  bool readsUtf8() const { return hf_ != nullptr; }
  // Pretraining data carries no template: the text's ids, then the end of the document.
  std::vector<uint32_t> encode(std::string_view text) const { return hf_ ? hf_->encode(text) : encodeBytes(text); }
  uint32_t eosTokenId() const { return eosTokenId_; }
  int64_t vocabSize() const { return vocabSize_; }
  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const HfTokenizer> hf_;
  uint32_t eosTokenId_ = kByteEosToken;
  int64_t vocabSize_ = kByteVocabSize;
  std::string name_ = kByteTokenizerName;
};

// Appends documents to the token stream, each followed by the end-of-document token.
class DocumentSink {
 public:
  explicit DocumentSink(const DocumentEncoder* encoder) : encoder_(encoder) {}
  void add(std::string_view text) {
    if (isBlank(text)) return;
    starts_.push_back(static_cast<int64_t>(tokens_.size()));
    std::vector<uint32_t> encoded = encoder_->encode(text);
    tokens_.insert(tokens_.end(), encoded.begin(), encoded.end());
    tokens_.push_back(encoder_->eosTokenId());
  }
  const std::vector<uint32_t>& tokens() const { return tokens_; }
  const std::vector<int64_t>& starts() const { return starts_; }

 private:
  const DocumentEncoder* encoder_;
  std::vector<uint32_t> tokens_;
  std::vector<int64_t> starts_;
};

Status addText(std::string_view text, const std::string& separator, DocumentSink* sink) {
  if (separator.empty()) {
    sink->add(text);
    return Status::ok();
  }
  // A document is the text between separator lines, newlines included, the separator lines not.
  size_t documentBegin = 0;
  RETURN_IF_ERROR(forEachLine(text, [&](std::string_view line, size_t lineBegin, int64_t) {
    const size_t nextLine = std::min(text.size(), lineBegin + line.size() + 1);
    if (endsWith(line, "\r")) line.remove_suffix(1);  // files written on Windows
    if (line != separator) return Status::ok();
    sink->add(text.substr(documentBegin, lineBegin - documentBegin));
    documentBegin = nextLine;
    return Status::ok();
  }));
  sink->add(text.substr(documentBegin));
  return Status::ok();
}

Status addJsonLines(std::string_view text, const std::string& path, const std::string& key, DocumentSink* sink) {
  return forEachLine(text, [&](std::string_view line, size_t, int64_t number) -> Status {
    if (isBlank(line)) return Status::ok();
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {  // a parse error, or out_of_range: a number too large
      // nlohmann's position is within the line; the line number is ours.
      std::string what = e.what();
      size_t column = what.find("column ");
      return invalidArgument("{}:{}: not valid JSON ({}): expected an object with a \"{}\" string", path, number,
                             column == std::string::npos ? what : what.substr(column), key);
    }
    if (!j.is_object())
      return invalidArgument("{}:{}: expected an object with a \"{}\" string, got {}", path, number, key,
                             j.type_name());
    auto it = j.find(key);
    if (it == j.end()) return invalidArgument("{}:{}: key \"{}\" is missing", path, number, key);
    if (!it->is_string())
      return invalidArgument("{}:{}: key \"{}\" must be a string, got {}", path, number, key, it->type_name());
    sink->add(it->get_ref<const std::string&>());
    return Status::ok();
  });
}

Status checkInput(const std::string& path) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) return invalidArgument("{}: no such file", path);
  if (ec) return invalidArgument("{}: {}", path, ec.message());
  if (std::filesystem::is_directory(status)) return invalidArgument("{}: is a directory; give the files in it", path);
  return Status::ok();
}

}  // namespace

Status PrepareOptions::validate() const {
  if (inputs.empty()) return invalidArgument("inputs: at least one input file is required");
  if (output.empty()) return invalidArgument("output: required");
  if (format != "auto" && format != "text" && format != "jsonl")
    return invalidArgument("format: must be auto, text or jsonl, got \"{}\"", format);
  if (textKey.empty()) return invalidArgument("text_key: must not be empty");
  if (separator.find('\n') != std::string::npos) return invalidArgument("separator: must be a single line");
  return Status::ok();
}

StatusOr<TokenFileHeader> prepareTokenFile(const PrepareOptions& options) {
  RETURN_IF_ERROR(options.validate());
  // Every input, and the output's directory, is checked before any input is read: a typo is
  // reported at once, not after minutes of tokenizing.
  for (const auto& input : options.inputs) RETURN_IF_ERROR(checkInput(input));
  const std::string outputDir = std::filesystem::path(options.output).parent_path().string();
  std::error_code ec;
  if (!outputDir.empty() && !std::filesystem::is_directory(outputDir, ec))
    return invalidArgument("{}: the directory {} does not exist", options.output, outputDir);

  ASSIGN_OR_RETURN(DocumentEncoder encoder, DocumentEncoder::open(options.tokenizer));

  DocumentSink sink(&encoder);
  for (const auto& input : options.inputs) {
    ASSIGN_OR_RETURN(std::string text, files::readFile(input));
    // The byte tokenizer takes any bytes; a Hugging Face tokenizer reads text, as `tokenizers` does.
    if (const size_t bad = utf8::firstInvalidOffset(text); encoder.readsUtf8() && bad != std::string::npos)
      return invalidArgument("{}: not valid UTF-8 at byte {}: a Hugging Face tokenizer reads UTF-8 text", input, bad);
    bool jsonl = options.format == "jsonl" ||
                 (options.format == "auto" && (endsWith(input, ".jsonl") || endsWith(input, ".json-lines")));
    if (jsonl) {
      RETURN_IF_ERROR(addJsonLines(text, input, options.textKey, &sink));
    } else {
      RETURN_IF_ERROR(addText(text, options.separator, &sink));
    }
  }
  if (sink.starts().empty()) return invalidArgument("no documents in the inputs: every one is empty or blank");

  // The narrowest dtype that holds every id of the vocabulary.
  TokenFileHeader header{.dtype = encoder.vocabSize() <= 65536 ? "uint16" : "uint32",
                         .vocabSize = encoder.vocabSize(),
                         .tokenizer = encoder.name(),
                         .eosTokenId = encoder.eosTokenId(),
                         .documentStarts = sink.starts()};
  RETURN_IF_ERROR(writeTokenFile(options.output, header, sink.tokens()));
  header.numTokens = static_cast<int64_t>(sink.tokens().size());
  return header;
}

}  // namespace loom::data
