#include "planner/rollout_spec.h"

#include "planner/json_reader.h"

namespace loom::planner {

using nlohmann::json;

namespace {

Status readIds(ObjectReader& r, const std::string& key, std::vector<int64_t>* out) {
  const json* value = r.find(key);
  if (!value) return Status::ok();
  if (!value->is_array()) return invalidArgument("{}: must be a list of token ids", r.pathOf(key));
  out->clear();
  for (const json& id : *value) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      return invalidArgument("{}: must be a list of token ids (integers >= 0), got {}", r.pathOf(key), id.dump());
    out->push_back(id.get<int64_t>());
  }
  return Status::ok();
}

}  // namespace

StatusOr<SamplingParams> parseSamplingParams(const json& object, const std::string& where,
                                             const SamplingParams& defaults) {
  if (!object.is_object()) return invalidArgument("{}: must be an object of sampling keys", where);
  SamplingParams p = defaults;
  ObjectReader r(object, where);
  RETURN_IF_ERROR(r.readDouble("temperature", &p.temperature, false, 0, 1e6));
  RETURN_IF_ERROR(r.readInt("top_k", &p.topK, false, -1, int64_t(1) << 31));
  if (p.topK == -1) p.topK = 0;
  if (const json* topP = r.find("top_p"); topP && topP->is_number() && (topP->get<double>() <= 0 || topP->get<double>() > 1))
    return invalidArgument("{}: {} is outside (0, 1]", r.pathOf("top_p"), topP->dump());
  RETURN_IF_ERROR(r.readDouble("top_p", &p.topP, false, 0, 1));
  RETURN_IF_ERROR(r.readDouble("min_p", &p.minP, false, 0, 1));
  if (const json* seed = r.find("seed"); seed && !seed->is_null()) {
    int64_t value = 0;
    RETURN_IF_ERROR(r.readInt("seed", &value, false, 0, INT64_MAX));
    p.seed = value;
  }
  RETURN_IF_ERROR(r.readInt("n", &p.n, false, 1, 1024));
  RETURN_IF_ERROR(readIds(r, "stop_token_ids", &p.stopTokenIds));
  if (const json* stop = r.find("stop"); stop && stop->is_string()) {
    p.stop = {stop->get<std::string>()};
  } else {
    RETURN_IF_ERROR(r.readStrings("stop", &p.stop, {}));
  }
  for (const std::string& s : p.stop)
    if (s.empty()) return invalidArgument("{}: a stop string must not be empty", r.pathOf("stop"));
  // max_tokens is vLLM's name for it.
  if (r.find("max_tokens") && r.find("max_new_tokens"))
    return invalidArgument("{}: give max_new_tokens or max_tokens, not both", where);
  RETURN_IF_ERROR(r.readInt("max_new_tokens", &p.maxNewTokens, false, 1, int64_t(1) << 31));
  RETURN_IF_ERROR(r.readInt("max_tokens", &p.maxNewTokens, false, 1, int64_t(1) << 31));
  RETURN_IF_ERROR(r.readBool("ignore_eos", &p.ignoreEos));
  RETURN_IF_ERROR(r.readInt("logprobs", &p.logprobs, false, 0, 20));
  if (Status unknown = r.rejectUnknown(); !unknown.isOk())
    return invalidArgument("{} (sampling keys: temperature, top_k, top_p, min_p, seed, n, stop, stop_token_ids, "
                           "max_new_tokens, ignore_eos, logprobs)",
                           unknown.message());
  return p;
}

json samplingParamsToJson(const SamplingParams& p) {
  json j{{"temperature", p.temperature}, {"top_k", p.topK},           {"top_p", p.topP},
         {"min_p", p.minP},             {"n", p.n},                   {"max_new_tokens", p.maxNewTokens},
         {"ignore_eos", p.ignoreEos},   {"logprobs", p.logprobs}};
  if (p.seed) j["seed"] = *p.seed;
  if (!p.stopTokenIds.empty()) j["stop_token_ids"] = p.stopTokenIds;
  if (!p.stop.empty()) j["stop"] = p.stop;
  return j;
}

Status parseRolloutSpec(const json& object, RolloutSpec* spec) {
  ObjectReader r(object, "rollout");
  RolloutSpec& s = *spec;
  RETURN_IF_ERROR(r.readString("prompts", &s.prompts, false));
  RETURN_IF_ERROR(r.readString("output", &s.output, false));
  RETURN_IF_ERROR(r.readBool("serve", &s.serve));
  RETURN_IF_ERROR(r.readString("tokenizer", &s.tokenizer, false));
  RETURN_IF_ERROR(r.readInt("block_size", &s.blockSize, false, 1, 1024));
  RETURN_IF_ERROR(r.readInt("max_num_seqs", &s.maxNumSeqs, false, 1, 1 << 20));
  RETURN_IF_ERROR(r.readInt("max_num_batched_tokens", &s.maxNumBatchedTokens, false, 1, 1 << 24));
  RETURN_IF_ERROR(r.readInt("max_model_len", &s.maxModelLen, false, 0, 1 << 26));
  RETURN_IF_ERROR(r.readDouble("kv_cache_memory_gb", &s.kvCacheMemoryGb, false, 0, 1e6));
  RETURN_IF_ERROR(r.readDouble("gpu_memory_utilization", &s.gpuMemoryUtilization, false, 0.01, 1));
  RETURN_IF_ERROR(r.readBool("cuda_graphs", &s.cudaGraphs));
  RETURN_IF_ERROR(r.readBool("async_scheduling", &s.asyncScheduling));
  RETURN_IF_ERROR(r.readString("dtype", &s.dtype, false));
  RETURN_IF_ERROR(r.readInt("seed", &s.seed, false, 0, INT64_MAX));
  RETURN_IF_ERROR(r.readInt("profile_step", &s.profileStep, false, 0, INT64_MAX));
  bool sharedPrefill = false;
  RETURN_IF_ERROR(r.readBool("use_shared_prefill", &sharedPrefill));
  if (sharedPrefill)
    return invalidArgument("rollout.use_shared_prefill: continuous batching does not support shared prompt prefill "
                           "(as DeepSpeed's rollout refuses it); the n samples of a prompt share its KV blocks anyway");
  if (s.dtype != "auto" && s.dtype != "float32" && s.dtype != "bfloat16" && s.dtype != "float16")
    return invalidArgument("rollout.dtype: \"{}\" is not one of auto, float32, bfloat16, float16", s.dtype);
  if (const json* sampling = r.find("sampling")) {
    ASSIGN_OR_RETURN(s.sampling, parseSamplingParams(*sampling, "rollout.sampling", SamplingParams{}));
  }
  RETURN_IF_ERROR(r.rejectUnknown());
  if (s.serve && (!s.prompts.empty() || !s.output.empty()))
    return invalidArgument("rollout.serve: a served rollout takes its requests over RolloutService, not from "
                           "rollout.prompts and rollout.output");
  if (!s.serve && (s.prompts.empty() || s.output.empty()))
    return invalidArgument("rollout.{}: required, unless rollout.serve is true", s.prompts.empty() ? "prompts" : "output");
  if (s.maxNumBatchedTokens < s.maxNumSeqs)
    return invalidArgument("rollout.max_num_batched_tokens: {} is below max_num_seqs {}: every running sequence "
                           "computes a token each step",
                           s.maxNumBatchedTokens, s.maxNumSeqs);
  return Status::ok();
}

json rolloutSpecToJson(const RolloutSpec& s) {
  json j{{"serve", s.serve},
         {"block_size", s.blockSize},
         {"max_num_seqs", s.maxNumSeqs},
         {"max_num_batched_tokens", s.maxNumBatchedTokens},
         {"max_model_len", s.maxModelLen},
         {"kv_cache_memory_gb", s.kvCacheMemoryGb},
         {"gpu_memory_utilization", s.gpuMemoryUtilization},
         {"cuda_graphs", s.cudaGraphs},
         {"async_scheduling", s.asyncScheduling},
         {"dtype", s.dtype},
         {"seed", s.seed},
         {"sampling", samplingParamsToJson(s.sampling)}};
  if (!s.prompts.empty()) j["prompts"] = s.prompts;
  if (!s.output.empty()) j["output"] = s.output;
  if (!s.tokenizer.empty()) j["tokenizer"] = s.tokenizer;
  if (s.profileStep > 0) j["profile_step"] = s.profileStep;
  return j;
}

}  // namespace loom::planner
