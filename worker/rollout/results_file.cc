#include "worker/rollout/results_file.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/files.h"

namespace loom::rollout {

Status writeResultsFile(const std::string& path, std::vector<SampleResult> results) {
  std::sort(results.begin(), results.end(), [](const SampleResult& a, const SampleResult& b) {
    return std::make_pair(a.order, a.sample) < std::make_pair(b.order, b.sample);
  });
  std::string out;
  for (const SampleResult& r : results) {
    nlohmann::ordered_json j;
    j["id"] = r.id;
    j["sample"] = r.sample;
    j["prompt_tokens"] = r.promptTokenIds.size();
    j["prompt_token_ids"] = r.promptTokenIds;
    j["token_ids"] = r.tokenIds;
    if (r.text) j["text"] = *r.text;
    j["logprobs"] = r.logprobs;
    if (!r.topLogprobs.empty()) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& position : r.topLogprobs) {
        nlohmann::json entries = nlohmann::json::array();
        for (const auto& [token, logprob] : position) entries.push_back({{"token_id", token}, {"logprob", logprob}});
        top.push_back(entries);
      }
      j["top_logprobs"] = top;
    }
    j["finish_reason"] = r.finishReason;
    j["time_to_first_token_s"] = r.timeToFirstTokenS;
    j["time_s"] = r.timeS;
    if (!r.reference.is_null()) j["reference"] = r.reference;
    out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  RETURN_IF_ERROR(files::writeFileAtomic(path, out).withContext("rollout.output"));
  return Status::ok();
}

}  // namespace loom::rollout
