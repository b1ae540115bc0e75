#include "worker/rollout/prompts_file.h"

#include <set>

#include <nlohmann/json.hpp>

#include "common/json_lines.h"
#include "planner/json_reader.h"

namespace loom::rollout {

using nlohmann::json;

namespace {

StatusOr<PromptLine> parseLine(const json& j, int64_t number, const planner::SamplingParams& defaults) {
  PromptLine line{.id = std::to_string(number), .line = number, .text = {}, .tokenIds = {}, .isText = false,
                  .sampling = defaults};
  if (!j.is_object()) return invalidArgument("must be a JSON object, got {}", j.type_name());
  planner::ObjectReader r(j, "");
  if (const json* id = r.find("id")) {
    if (id->is_string()) {
      line.id = id->get<std::string>();
    } else if (id->is_number_integer()) {
      line.id = std::to_string(id->get<int64_t>());
    } else {
      return invalidArgument("id: must be a string or an integer, got {}", id->dump());
    }
  }
  const json* text = r.find("prompt");
  const json* ids = r.find("prompt_token_ids");
  if ((text != nullptr) == (ids != nullptr))
    return invalidArgument("needs one of prompt (text) and prompt_token_ids (a list of token ids)");
  if (text) {
    if (!text->is_string()) return invalidArgument("prompt: must be text, got {}", text->dump());
    line.text = text->get<std::string>();
    line.isText = true;
  } else {
    if (!ids->is_array()) return invalidArgument("prompt_token_ids: must be a list of token ids");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0)
        return invalidArgument("prompt_token_ids: {} is not a token id (an integer >= 0)", id.dump());
      line.tokenIds.push_back(id.get<int64_t>());
    }
  }
  RETURN_IF_ERROR(r.readDouble("arrival_s", &line.arrivalS, false, 0, 1e7));
  if (const json* reference = r.find("reference")) line.reference = *reference;
  if (const json* sampling = r.find("sampling")) {
    ASSIGN_OR_RETURN(line.sampling, planner::parseSamplingParams(*sampling, "sampling", defaults));
  }
  RETURN_IF_ERROR(r.rejectUnknown());
  return line;
}

}  // namespace

StatusOr<std::vector<PromptLine>> readPromptsFile(const std::string& path, const planner::SamplingParams& defaults) {
  std::vector<PromptLine> lines;
  std::set<std::string> ids;
  RETURN_IF_ERROR(forEachJsonLine(path, "rollout.prompts", [&](const json& j, int64_t number) -> Status {
    ASSIGN_OR_RETURN(PromptLine line, parseLine(j, number, defaults));
    if (!ids.insert(line.id).second) return invalidArgument("id: \"{}\" is used by an earlier line", line.id);
    lines.push_back(std::move(line));
    return Status::ok();
  }));
  if (lines.empty()) return invalidArgument("rollout.prompts: {} holds no prompt", path);
  return lines;
}

Status checkTokenizerNeeds(bool isText, const planner::SamplingParams& sampling, const data::HfTokenizer* tokenizer) {
  if (tokenizer) return Status::ok();
  if (isText) return invalidArgument("prompt: a text prompt needs rollout.tokenizer (or give prompt_token_ids)");
  if (!sampling.stop.empty())
    return invalidArgument("sampling.stop: stop strings need rollout.tokenizer (stop_token_ids do not)");
  return Status::ok();
}

StatusOr<std::vector<int64_t>> promptTokenIds(bool isText, const std::string& text, std::vector<int64_t> ids,
                                              const planner::SamplingParams& sampling,
                                              const data::HfTokenizer* tokenizer) {
  RETURN_IF_ERROR(checkTokenizerNeeds(isText, sampling, tokenizer));
  if (!isText) return ids;
  const std::vector<uint32_t> encoded = tokenizer->encode(text, {.addSpecialTokens = true});
  return std::vector<int64_t>(encoded.begin(), encoded.end());
}

}  // namespace loom::rollout
