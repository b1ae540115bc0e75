#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "loom/v1/rollout.pb.h"

namespace loom::loomctl {

// One line of a prompts file (worker/rollout/prompts_file.h's format: "id", "prompt" or
// "prompt_token_ids", "sampling", "reference") as a RolloutService request. The sampling keys go as
// they are, over the job's rollout.sampling, which the served job checks.
struct PromptRequest {
  std::string id;  // the line's, else its index in the file from 0
  v1::GenerateRequest request;
  nlohmann::json reference;  // null: none
};

// Every line of `path`; `samplingJson` (may be empty) is the sampling of lines without their own.
// Errors name the file and the line.
StatusOr<std::vector<PromptRequest>> readPromptRequests(const std::string& path, const std::string& samplingJson);

inline StatusCode codeOf(const Status& s) { return s.code(); }
template <typename T>
StatusCode codeOf(const StatusOr<T>& s) {
  return s.status().code();
}

// Calls `call` again while the job does not serve yet (Unavailable: its model still loading), for
// up to `waitS` seconds.
template <typename Call>
auto retryWhileUnavailable(double waitS, Call&& call) -> decltype(call()) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(waitS * 1000));
  for (;;) {
    auto result = call();
    if (codeOf(result) != StatusCode::kUnavailable || Clock::now() >= deadline) return result;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace loom::loomctl
