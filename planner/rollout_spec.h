#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace loom::planner {

// How one request's tokens are drawn, vLLM's SamplingParams by their names: the rollout's
// defaults (rollout.sampling), which a request's own keys override.
struct SamplingParams {
  double temperature = 1.0;  // <= 1e-5: greedy
  int64_t topK = 0;          // 0 or -1: off
  double topP = 1.0;         // in (0, 1]
  double minP = 0.0;         // in [0, 1]
  std::optional<int64_t> seed;  // unset: from rollout.seed and the request's number
  int64_t n = 1;
  std::vector<int64_t> stopTokenIds;
  std::vector<std::string> stop;  // stop strings (need the tokenizer); the output ends before them
  int64_t maxNewTokens = 16;
  bool ignoreEos = false;
  int64_t logprobs = 0;  // besides the chosen token's logprob, the top `logprobs` of each position

  bool greedy() const { return temperature <= 1e-5; }
};

// Reads the keys of `object` over `defaults` (a request's own keys over the rollout's). Unknown
// keys and values out of range are errors naming `where`.key.
StatusOr<SamplingParams> parseSamplingParams(const nlohmann::json& object, const std::string& where,
                                             const SamplingParams& defaults);
nlohmann::json samplingParamsToJson(const SamplingParams& params);

// rollout: generation from a model (worker/torch/jobs/rollout_job.h), with prompts from a file
// (batch mode) or from RolloutService streams (serve).
struct RolloutSpec {
  std::string prompts;  // JSONL: per line a prompt (text or token ids) and optionally its sampling
  std::string output;   // JSONL: per request and sample, its tokens, text, logprobs, finish reason, times
  bool serve = false;
  // A directory with a Hugging Face tokenizer.json, for text prompts and text output; empty:
  // token ids only.
  std::string tokenizer;
  // The engine's limits, vLLM's names.
  int64_t blockSize = 16;
  int64_t maxNumSeqs = 256;
  int64_t maxNumBatchedTokens = 8192;
  int64_t maxModelLen = 0;  // 0: the model's max_position_embeddings
  // The KV cache's size. 0: on cuda, gpu_memory_utilization of the device less what the model
  // and a step take; on cpu, 1 GiB.
  double kvCacheMemoryGb = 0;
  double gpuMemoryUtilization = 0.9;
  bool cudaGraphs = true;  // decode steps replayed as CUDA graphs (cuda only)
  // The next step scheduled and launched while the device runs this one (tensor parallelism 1).
  bool asyncScheduling = true;
  std::string dtype = "auto";  // auto: bfloat16 on cuda, float32 on cpu; or float32, bfloat16, float16
  int64_t seed = 0;  // requests without a seed of their own draw from it and their number
  // A step (1-based) that runs under libtorch's profiler, printing where its time went. 0: none.
  int64_t profileStep = 0;
  SamplingParams sampling;
};

Status parseRolloutSpec(const nlohmann::json& object, RolloutSpec* spec);
nlohmann::json rolloutSpecToJson(const RolloutSpec& spec);

}  // namespace loom::planner
