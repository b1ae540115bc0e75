#include "worker/data/hf_tokenizer_json.h"

#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace loom::data {

namespace {

using nlohmann::json;

// A JSON value and the path that names it in messages ("model.merges[3]"). A missing key reads as
// null, as `tokenizers` reads it.
class Node {
 public:
  Node(const json& value, std::string path) : value_(value), path_(std::move(path)) {}

  const json& value() const { return value_; }
  const std::string& path() const { return path_; }
  bool isNull() const { return value_.is_null(); }

  Node at(std::string_view key) const {
    static const json kNull;
    auto it = value_.is_object() ? value_.find(key) : value_.end();
    return {value_.is_object() && it != value_.end() ? *it : kNull, fieldPath(key)};
  }
  Node at(size_t i) const { return {value_[i], fmt::format("{}[{}]", path_, i)}; }

  Status expect(json::value_t type, std::string_view what) const {
    if (value_.type() == type) return Status::ok();
    return invalidArgument("{}: must be {}, got {}", path_, what, describe());
  }
  StatusOr<bool> boolean(bool fallback) const {
    if (isNull()) return fallback;
    RETURN_IF_ERROR(expect(json::value_t::boolean, "true or false"));
    return value_.get<bool>();
  }
  StatusOr<std::string> string() const {
    RETURN_IF_ERROR(expect(json::value_t::string, "a string"));
    return value_.get<std::string>();
  }
  StatusOr<uint32_t> id() const {
    if (!value_.is_number_unsigned() || value_.get<uint64_t>() > std::numeric_limits<uint32_t>::max())
      return invalidArgument("{}: must be a token id (an integer from 0 to 2^32-1), got {}", path_, describe());
    return value_.get<uint32_t>();
  }
  // The "type" of a component object: `what` names the component in the message.
  StatusOr<std::string> type(std::string_view what) const {
    RETURN_IF_ERROR(expect(json::value_t::object, fmt::format("a {} object", what)));
    return at("type").string();
  }
  // A value this field may only have one setting of: fails unless it equals `required` (or is null).
  Status require(const json& required, std::string_view why) const {
    if (isNull() || value_ == required) return Status::ok();
    return invalidArgument("{}: {} is not supported: {}", path_, describe(), why);
  }
  std::string describe() const {
    std::string s = value_.dump(-1, ' ', false, json::error_handler_t::replace);
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
  }

 private:
  std::string fieldPath(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  const json& value_;
  std::string path_;
};

Status parseAddedTokens(const Node& list, HfTokenizerSpec* spec) {
  if (list.isNull()) return Status::ok();
  RETURN_IF_ERROR(list.expect(json::value_t::array, "an array"));
  for (size_t i = 0; i < list.value().size(); ++i) {
    const Node entry = list.at(i);
    RETURN_IF_ERROR(entry.expect(json::value_t::object, "an object"));
    AddedToken token;
    ASSIGN_OR_RETURN(token.id, entry.at("id").id());
    ASSIGN_OR_RETURN(token.content, entry.at("content").string());
    if (token.content.empty()) return invalidArgument("{}: must not be empty", entry.at("content").path());
    ASSIGN_OR_RETURN(token.special, entry.at("special").boolean(false));
    ASSIGN_OR_RETURN(token.lstrip, entry.at("lstrip").boolean(false));
    ASSIGN_OR_RETURN(token.rstrip, entry.at("rstrip").boolean(false));
    ASSIGN_OR_RETURN(token.normalized, entry.at("normalized").boolean(!token.special));
    RETURN_IF_ERROR(entry.at("single_word").require(false, "Loom matches added tokens anywhere in the text"));
    spec->addedTokens.push_back(std::move(token));
  }
  return Status::ok();
}

Status parseNormalizer(const Node& n, HfTokenizerSpec* spec) {
  if (n.isNull()) return Status::ok();
  ASSIGN_OR_RETURN(std::string type, n.type("normalizer"));
  if (type == "NFC") {
    spec->nfc = true;
    return Status::ok();
  }
  if (type == "Sequence") {
    const Node list = n.at("normalizers");
    RETURN_IF_ERROR(list.expect(json::value_t::array, "an array"));
    for (size_t i = 0; i < list.value().size(); ++i) RETURN_IF_ERROR(parseNormalizer(list.at(i), spec));
    return Status::ok();
  }
  return invalidArgument("{}: \"{}\" is not supported (null, NFC, or a Sequence of NFC)", n.at("type").path(), type);
}

Status parseSplit(const Node& n, HfTokenizerSpec* spec) {
  const Node pattern = n.at("pattern");
  RETURN_IF_ERROR(pattern.expect(json::value_t::object, "an object with a \"Regex\""));
  const Node regex = pattern.at("Regex");
  if (regex.isNull())
    return invalidArgument("{}: {} is not supported: Loom knows the Regex patterns of GPT-2, Llama 3, Qwen2 and "
                           "Mistral",
                           pattern.path(), pattern.describe());
  ASSIGN_OR_RETURN(std::string text, regex.string());
  auto known = splitPatternOf(text);
  if (!known)
    return invalidArgument("{}: unknown pattern \"{}\": Loom knows the patterns of GPT-2, Llama 3, Qwen2 and Mistral "
                           "(Tekken), by their exact text",
                           regex.path(), text);
  RETURN_IF_ERROR(n.at("behavior").require("Isolated", "Loom splits with behavior \"Isolated\""));
  RETURN_IF_ERROR(n.at("invert").require(false, "Loom splits with invert false"));
  spec->splits.push_back(*known);
  return Status::ok();
}

Status parseByteLevel(const Node& n, HfTokenizerSpec* spec) {
  // tokenizers' defaults for keys left out: add_prefix_space and use_regex true.
  ASSIGN_OR_RETURN(spec->addPrefixSpace, n.at("add_prefix_space").boolean(true));
  ASSIGN_OR_RETURN(spec->byteLevelSplit, n.at("use_regex").boolean(true));
  return Status::ok();
}

constexpr char kPreTokenizerSupport[] =
    "Loom reads byte-level tokenizers: ByteLevel, or a Sequence of Split steps ending in ByteLevel";

Status parsePreTokenizer(const Node& n, HfTokenizerSpec* spec) {
  if (n.isNull()) return invalidArgument("{}: null is not supported: {}", n.path(), kPreTokenizerSupport);
  ASSIGN_OR_RETURN(std::string type, n.type("pre_tokenizer"));
  if (type == "ByteLevel") return parseByteLevel(n, spec);
  if (type != "Sequence")
    return invalidArgument("{}: \"{}\" is not supported: {}", n.at("type").path(), type, kPreTokenizerSupport);
  const Node list = n.at("pretokenizers");
  RETURN_IF_ERROR(list.expect(json::value_t::array, "an array"));
  const size_t count = list.value().size();
  for (size_t i = 0; i < count; ++i) {
    const Node step = list.at(i);
    ASSIGN_OR_RETURN(std::string stepType, step.type("pre-tokenizer"));
    if (stepType == "Split") {
      RETURN_IF_ERROR(parseSplit(step, spec));
    } else if (stepType == "ByteLevel" && i + 1 == count) {
      RETURN_IF_ERROR(parseByteLevel(step, spec));
    } else {
      return invalidArgument("{}: \"{}\" is not supported here: {}", step.at("type").path(), stepType,
                             kPreTokenizerSupport);
    }
  }
  if (count == 0 || list.at(count - 1).at("type").value() != "ByteLevel")
    return invalidArgument("{}: must end in ByteLevel: {}", list.path(), kPreTokenizerSupport);
  return Status::ok();
}

// One merge, spelled either way found in the wild: "left right" (older files) or ["left", "right"].
bool readMerge(const json& m, BpeModel::Merge* out) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == s.size() || s.find(' ', space + 1) != std::string::npos)
      return false;
    *out = {s.substr(0, space), s.substr(space + 1)};
    return true;
  }
  if (!m.is_array() || m.size() != 2 || !m[0].is_string() || !m[1].is_string()) return false;
  *out = {m[0].get<std::string>(), m[1].get<std::string>()};
  return true;
}

Status parseMerges(const Node& list, HfTokenizerSpec* spec) {
  RETURN_IF_ERROR(list.expect(json::value_t::array, "an array"));
  spec->merges.resize(list.value().size());
  for (size_t i = 0; i < list.value().size(); ++i) {
    if (readMerge(list.value()[i], &spec->merges[i])) continue;
    const Node m = list.at(i);
    return invalidArgument("{}: must be \"left right\" or [\"left\", \"right\"], got {}", m.path(), m.describe());
  }
  return Status::ok();
}

Status parseModel(const Node& n, HfTokenizerSpec* spec) {
  RETURN_IF_ERROR(n.expect(json::value_t::object, "an object"));
  const Node type = n.at("type");
  if (type.isNull()) return invalidArgument("{}: missing: Loom reads BPE models (\"type\": \"BPE\")", type.path());
  ASSIGN_OR_RETURN(std::string typeName, type.string());
  if (typeName != "BPE")
    return invalidArgument("{}: \"{}\" is not supported: Loom reads byte-level BPE models (\"BPE\")", type.path(),
                           typeName);
  RETURN_IF_ERROR(n.at("dropout").require(0.0, "Loom does not sample BPE dropout"));
  RETURN_IF_ERROR(n.at("unk_token").require(nullptr, "a byte-level BPE needs no unknown token"));
  RETURN_IF_ERROR(n.at("byte_fallback").require(false, "a byte-level BPE has every byte in its alphabet"));
  RETURN_IF_ERROR(n.at("continuing_subword_prefix").require("", "Loom reads byte-level BPE models without one"));
  RETURN_IF_ERROR(n.at("end_of_word_suffix").require("", "Loom reads byte-level BPE models without one"));
  ASSIGN_OR_RETURN(spec->ignoreMerges, n.at("ignore_merges").boolean(false));
  const Node vocab = n.at("vocab");
  RETURN_IF_ERROR(vocab.expect(json::value_t::object, "an object of token: id"));
  spec->vocab.reserve(vocab.value().size());
  for (const auto& [token, value] : vocab.value().items()) {
    const bool isId = value.is_number_unsigned() && value.get<uint64_t>() <= std::numeric_limits<uint32_t>::max();
    if (!isId) return Node(value, fmt::format("{}[\"{}\"]", vocab.path(), token)).id().status();
    spec->vocab.emplace(token, value.get<uint32_t>());
  }
  return parseMerges(n.at("merges"), spec);
}

// A TemplateProcessing's `single` template, resolved to ids through its special_tokens.
Status parseTemplate(const Node& n, HfTokenizerSpec* spec) {
  const Node single = n.at("single");
  RETURN_IF_ERROR(single.expect(json::value_t::array, "an array"));
  const Node specials = n.at("special_tokens");
  for (size_t i = 0; i < single.value().size(); ++i) {
    const Node item = single.at(i);
    if (const Node text = item.at("Sequence"); !text.isNull()) {
      RETURN_IF_ERROR(text.at("id").require("A", "a single text's template has only sequence A"));
      spec->singleTemplate.push_back({.isText = true});
      continue;
    }
    const Node special = item.at("SpecialToken");
    if (special.isNull())
      return invalidArgument("{}: must be {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}, got {}", item.path(),
                             item.describe());
    ASSIGN_OR_RETURN(std::string name, special.at("id").string());
    const Node ids = specials.at(name).at("ids");
    RETURN_IF_ERROR(ids.expect(json::value_t::array, fmt::format("the ids of special token \"{}\"", name)));
    HfTokenizerSpec::TemplateItem resolved;
    for (size_t k = 0; k < ids.value().size(); ++k) {
      ASSIGN_OR_RETURN(uint32_t id, ids.at(k).id());
      resolved.ids.push_back(id);
    }
    spec->singleTemplate.push_back(std::move(resolved));
  }
  return Status::ok();
}

Status parsePostProcessor(const Node& n, HfTokenizerSpec* spec) {
  if (n.isNull()) return Status::ok();
  ASSIGN_OR_RETURN(std::string type, n.type("post_processor"));
  if (type == "ByteLevel") return Status::ok();  // it only moves offsets
  if (type == "TemplateProcessing") return parseTemplate(n, spec);
  if (type == "Sequence") {
    const Node list = n.at("processors");
    RETURN_IF_ERROR(list.expect(json::value_t::array, "an array"));
    for (size_t i = 0; i < list.value().size(); ++i) RETURN_IF_ERROR(parsePostProcessor(list.at(i), spec));
    return Status::ok();
  }
  return invalidArgument("{}: \"{}\" is not supported (null, ByteLevel, TemplateProcessing, or a Sequence of them)",
                         n.at("type").path(), type);
}

Status parseDecoder(const Node& n) {
  constexpr char kSupport[] = "Loom decodes byte-level tokens with a ByteLevel decoder";
  if (n.isNull()) return invalidArgument("{}: null is not supported: {}", n.path(), kSupport);
  ASSIGN_OR_RETURN(std::string type, n.type("decoder"));
  if (type == "ByteLevel") return Status::ok();
  if (type == "Sequence") {
    const Node list = n.at("decoders");
    RETURN_IF_ERROR(list.expect(json::value_t::array, "an array"));
    if (list.value().size() == 1) return parseDecoder(list.at(0));
  }
  return invalidArgument("{}: \"{}\" is not supported: {}", n.at("type").path(), type, kSupport);
}

}  // namespace

StatusOr<HfTokenizerSpec> parseTokenizerJson(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // a parse error, or out_of_range: a number too large
    return invalidArgument("not valid JSON: {}", e.what());
  }
  const Node root(j, "");
  RETURN_IF_ERROR(root.expect(json::value_t::object, "an object"));
  RETURN_IF_ERROR(root.at("truncation").require(nullptr, "Loom neither truncates nor pads"));
  RETURN_IF_ERROR(root.at("padding").require(nullptr, "Loom neither truncates nor pads"));
  HfTokenizerSpec spec;
  RETURN_IF_ERROR(parseModel(root.at("model"), &spec));
  RETURN_IF_ERROR(parseAddedTokens(root.at("added_tokens"), &spec));
  RETURN_IF_ERROR(parseNormalizer(root.at("normalizer"), &spec));
  RETURN_IF_ERROR(parsePreTokenizer(root.at("pre_tokenizer"), &spec));
  RETURN_IF_ERROR(parsePostProcessor(root.at("post_processor"), &spec));
  RETURN_IF_ERROR(parseDecoder(root.at("decoder")));
  return spec;
}

}  // namespace loom::data
