#include "client/loomctl/rollout_requests.h"

#include "common/json_lines.h"

namespace loom::loomctl {

StatusOr<std::vector<PromptRequest>> readPromptRequests(const std::string& path, const std::string& samplingJson) {
  std::vector<PromptRequest> out;
  RETURN_IF_ERROR(forEachJsonLine(path, "prompts", [&](const nlohmann::json& j, int64_t) -> Status {
    if (!j.is_object()) return invalidArgument("not a JSON object");
    PromptRequest p;
    p.id = std::to_string(out.size());
    for (const auto& [key, value] : j.items()) {
      if (key == "id") {
        p.id = value.is_string() ? value.get<std::string>() : value.dump();
      } else if (key == "prompt" && value.is_string()) {
        p.request.set_prompt(value.get<std::string>());
      } else if (key == "prompt_token_ids" && value.is_array()) {
        for (const auto& t : value) {
          if (!t.is_number_integer()) return invalidArgument("prompt_token_ids: {} is not a token id", t.dump());
          p.request.add_prompt_token_ids(t.get<int64_t>());
        }
      } else if (key == "sampling" && value.is_object()) {
        p.request.set_sampling_json(value.dump());
      } else if (key == "reference") {
        p.reference = value;
      } else {
        return invalidArgument("{}: unknown key or wrong type (keys: id, prompt, prompt_token_ids, sampling, reference)",
                               key);
      }
    }
    if (p.request.sampling_json().empty()) p.request.set_sampling_json(samplingJson);
    out.push_back(std::move(p));
    return Status::ok();
  }));
  if (out.empty()) return invalidArgument("prompts: {} holds no prompt", path);
  return out;
}

}  // namespace loom::loomctl
