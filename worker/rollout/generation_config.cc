#include "worker/rollout/generation_config.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/files.h"

namespace loom::rollout {

namespace {

// eos_token_id of one JSON file; false when it has none.
StatusOr<bool> readEos(const std::string& path, std::vector<int64_t>* ids) {
  ASSIGN_OR_RETURN(std::string text, files::readFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("{}: not a JSON object", path);
  auto eos = j.find("eos_token_id");
  if (eos == j.end() || eos->is_null()) return false;
  const nlohmann::json list = eos->is_array() ? *eos : nlohmann::json::array({*eos});
  for (const auto& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      return invalidArgument("{}: eos_token_id: {} is not a token id", path, id.dump());
    ids->push_back(id.get<int64_t>());
  }
  return true;
}

}  // namespace

StatusOr<std::vector<int64_t>> readEosTokenIds(const std::string& configPath) {
  std::vector<int64_t> ids;
  const auto generation = std::filesystem::path(configPath).parent_path() / "generation_config.json";
  if (std::filesystem::exists(generation)) {
    ASSIGN_OR_RETURN(bool found, readEos(generation.string(), &ids));
    if (found) return ids;
  }
  ASSIGN_OR_RETURN(bool found, readEos(configPath, &ids));
  (void)found;
  return ids;
}

}  // namespace loom::rollout
