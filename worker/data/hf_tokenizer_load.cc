// HfTokenizer::load: tokenizer.json, and the end and start tokens that tokenizer_config.json and
// generation_config.json name.
#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "worker/data/hf_tokenizer.h"

namespace loom::data {

namespace {

using nlohmann::json;

// The JSON object in `path`, or an empty object when there is no such file.
StatusOr<json> readOptionalJsonObject(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return json::object();
  ASSIGN_OR_RETURN(std::string text, files::readFile(path));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // a parse error, or out_of_range: a number too large
    return invalidArgument("{}: not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) return invalidArgument("{}: must hold a JSON object, got {}", path, j.type_name());
  return j;
}

// A token named in tokenizer_config.json: "<|eos|>", {"content": "<|eos|>", ...} or null.
StatusOr<std::optional<uint32_t>> namedToken(const HfTokenizer& t, const json& config, const std::string& file,
                                             const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<uint32_t>();
  const json* content = &*it;
  if (it->is_object()) {
    auto c = it->find("content");
    if (c == it->end()) return invalidArgument("{}: {}: an object needs \"content\"", file, key);
    content = &*c;
  }
  if (!content->is_string())
    return invalidArgument("{}: {}: must be a token's text or {{\"content\": text}}, got {}", file, key,
                           it->dump(-1, ' ', false, json::error_handler_t::replace));
  const std::string& text = content->get_ref<const std::string&>();
  auto id = t.tokenId(text);
  if (!id) return invalidArgument("{}: {}: \"{}\" is not a token of tokenizer.json", file, key, text);
  return id;
}

// generation_config.json's ids: an id, a list of ids, or null.
StatusOr<std::vector<uint32_t>> idList(const HfTokenizer& t, const json& config, const std::string& file,
                                       const char* key) {
  auto it = config.find(key);
  std::vector<uint32_t> ids;
  if (it == config.end() || it->is_null()) return ids;
  const json list = it->is_array() ? *it : json::array({*it});
  for (const json& v : list) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() >= static_cast<uint64_t>(t.vocabSize()))
      return invalidArgument("{}: {}: must be a token id or a list of them, each below the vocabulary size {}, got {}",
                             file, key, t.vocabSize(), it->dump());
    ids.push_back(v.get<uint32_t>());
  }
  return ids;
}

}  // namespace

StatusOr<HfTokenizer> HfTokenizer::load(const std::string& directory) {
  std::error_code ec;
  if (!std::filesystem::is_directory(directory, ec))
    return invalidArgument("{}: not a directory (a tokenizer is a directory holding tokenizer.json)", directory);
  const std::filesystem::path dir(directory);
  const std::string tokenizerPath = (dir / "tokenizer.json").string();
  if (!std::filesystem::is_regular_file(tokenizerPath, ec))
    return invalidArgument("{}: no such file (a Hugging Face tokenizer directory has one)", tokenizerPath);
  ASSIGN_OR_RETURN(std::string text, files::readFile(tokenizerPath));
  ASSIGN_OR_RETURN(HfTokenizer t, fromJson(text, tokenizerPath));

  const std::string configPath = (dir / "tokenizer_config.json").string();
  const std::string generationPath = (dir / "generation_config.json").string();
  ASSIGN_OR_RETURN(json config, readOptionalJsonObject(configPath));
  ASSIGN_OR_RETURN(json generation, readOptionalJsonObject(generationPath));
  ASSIGN_OR_RETURN(std::optional<uint32_t> eos, namedToken(t, config, configPath, "eos_token"));
  ASSIGN_OR_RETURN(std::optional<uint32_t> bos, namedToken(t, config, configPath, "bos_token"));
  ASSIGN_OR_RETURN(std::vector<uint32_t> generationEos, idList(t, generation, generationPath, "eos_token_id"));
  ASSIGN_OR_RETURN(std::vector<uint32_t> generationBos, idList(t, generation, generationPath, "bos_token_id"));
  if (eos) t.eosTokenIds_.push_back(*eos);
  for (uint32_t id : generationEos) {
    auto& ids = t.eosTokenIds_;
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  t.bosTokenId_ = bos ? bos : (generationBos.empty() ? std::nullopt : std::optional<uint32_t>(generationBos.front()));
  return t;
}

}  // namespace loom::data
