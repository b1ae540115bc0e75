#include "planner/deepspeed_parallel.h"

#include <algorithm>
#include <set>

namespace loom::planner {

using nlohmann::json;

namespace {

constexpr int64_t kMaxRanks = 65536;

std::string layerSpecPath(size_t i) {
  return fmt::format("deepspeed.tensor_parallel.partition_config.layer_specs[{}]", i);
}

// `shape`: one entry per dimension, an integer (a size, or -1) or, at the partition dimension
// only, a list of sub-parameter sizes (DeepSpeed's one level of nesting). An integer n at the
// partition dimension packs n equal sub-parameters.
Status parseShape(const json& value, const std::string& path, int partitionDim, std::vector<TpShapeDim>* out) {
  if (!value.is_array() || value.empty())
    return invalidArgument("{}: must be a list with one entry per dimension, got {}", path, value.dump());
  if (partitionDim >= static_cast<int>(value.size()))
    return invalidArgument("{}: partition_dim {} is out of range for a shape of {} dimensions", path, partitionDim,
                           value.size());
  for (size_t d = 0; d < value.size(); ++d) {
    const json& v = value[d];
    TpShapeDim dim;
    const bool atPartition = static_cast<int>(d) == partitionDim;
    if (v.is_array()) {
      if (!atPartition)
        return invalidArgument("{}[{}]: a list of sub-parameter sizes is allowed only at partition_dim {}", path, d,
                               partitionDim);
      if (v.empty()) return invalidArgument("{}[{}]: the list of sub-parameter sizes is empty", path, d);
      for (const auto& x : v) {
        if (!x.is_number_integer() || x.get<int64_t>() <= 0)
          return invalidArgument("{}[{}]: sub-parameter sizes must be positive integers (one level of nesting), got "
                                 "{}",
                                 path, d, x.dump());
        dim.subParams.push_back(x.get<int64_t>());
      }
    } else if (v.is_number_integer() && (v.get<int64_t>() > 0 || v.get<int64_t>() == -1)) {
      if (atPartition && v.get<int64_t>() > 0) {
        dim.count = v.get<int64_t>();
      } else {
        dim.size = v.get<int64_t>();
      }
    } else {
      return invalidArgument("{}[{}]: must be a positive integer or -1, got {}", path, d, v.dump());
    }
    out->push_back(std::move(dim));
  }
  return Status::ok();
}

Status parseLayerSpec(const json& item, size_t index, TpLayerSpec* spec) {
  const std::string path = layerSpecPath(index);
  if (!item.is_object()) return invalidArgument("{}: must be an object, got {}", path, item.type_name());
  ObjectReader r(item, path);
  RETURN_IF_ERROR(r.readStrings("patterns", &spec->patterns, {}));
  if (spec->patterns.empty())
    return invalidArgument("{}.patterns: required, a list of regexes matched against parameter names", path);
  std::string type = "column";
  RETURN_IF_ERROR(r.readString("partition_type", &type, false));
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
  if (type == "column") {
    spec->split = TpSplit::kColumn;
  } else if (type == "row") {
    spec->split = TpSplit::kRow;
  } else if (type == "skip") {
    spec->split = TpSplit::kReplicated;
  } else {
    return invalidArgument("{}.partition_type: must be column, row or skip, got \"{}\"", path, type);
  }
  int64_t dim = -1;
  RETURN_IF_ERROR(r.readInt("partition_dim", &dim, false, 0, 7));
  if (dim >= 0) spec->partitionDim = static_cast<int>(dim);
  RETURN_IF_ERROR(r.readBool("gather_output", &spec->gatherOutput));
  RETURN_IF_ERROR(r.readBool("grad_allreduce", &spec->gradAllreduce));
  if (const json* shape = r.find("shape"); shape && !shape->is_null()) {
    const int partitionDim = spec->partitionDim.value_or(spec->split == TpSplit::kRow ? 1 : 0);
    RETURN_IF_ERROR(parseShape(*shape, path + ".shape", partitionDim, &spec->shape));
  }
  const bool skip = spec->split == TpSplit::kReplicated;
  if (skip && (!spec->shape.empty() || spec->partitionDim))
    return invalidArgument("{}: shape and partition_dim do not apply to partition_type skip", path);
  if (spec->gatherOutput && spec->split != TpSplit::kColumn)
    return invalidArgument("{}.gather_output: applies to partition_type column only", path);
  if (spec->gradAllreduce && !skip)
    return invalidArgument("{}.grad_allreduce: applies to partition_type skip only (a whole parameter whose "
                           "gradient is summed over the tensor-parallel group)",
                           path);
  return r.rejectUnknown();
}

Status parseTensorParallel(const json& object, TensorParallelConfig* tp) {
  ObjectReader r(object, "deepspeed.tensor_parallel");
  int64_t size = 0;
  RETURN_IF_ERROR(r.readInt("autotp_size", &size, false, 0, kMaxRanks));
  tp->size = static_cast<int>(size);
  ASSIGN_OR_RETURN(const json* partition, r.readObject("partition_config"));
  RETURN_IF_ERROR(r.rejectUnknown());
  if (!partition) return Status::ok();
  ObjectReader p(*partition, "deepspeed.tensor_parallel.partition_config");
  RETURN_IF_ERROR(p.readBool("use_default_specs", &tp->useDefaultSpecs));
  RETURN_IF_ERROR(p.readBool("strict_mode", &tp->strictMode));
  if (const json* specs = p.find("layer_specs"); specs && !specs->is_null()) {
    if (!specs->is_array())
      return invalidArgument("deepspeed.tensor_parallel.partition_config.layer_specs: must be a list, got {}",
                             specs->type_name());
    for (size_t i = 0; i < specs->size(); ++i) {
      TpLayerSpec spec;
      RETURN_IF_ERROR(parseLayerSpec((*specs)[i], i, &spec));
      tp->layerSpecs.push_back(std::move(spec));
    }
  }
  return p.rejectUnknown();
}

// A key that DeepSpeed lets be a number or "auto" (or null).
Status readNumberOrAuto(ObjectReader& r, const std::string& key, bool integer, double min, std::optional<double>* out) {
  const json* v = r.find(key);
  if (!v || v->is_null() || (v->is_string() && v->get<std::string>() == "auto")) return Status::ok();
  if (!v->is_number() || (integer && !v->is_number_integer()))
    return invalidArgument("{}: must be {} or \"auto\", got {}", r.pathOf(key), integer ? "an integer" : "a number",
                           v->dump());
  if (!(v->get<double>() >= min))
    return invalidArgument("{}: must be at least {}, got {}", r.pathOf(key), min, v->dump());
  *out = v->get<double>();
  return Status::ok();
}

Status readOptionalBool(ObjectReader& r, const std::string& key, std::optional<bool>* out) {
  const json* v = r.find(key);
  if (!v || v->is_null()) return Status::ok();
  if (!v->is_boolean()) return invalidArgument("{}: must be true, false or null, got {}", r.pathOf(key), v->dump());
  *out = v->get<bool>();
  return Status::ok();
}

// DeepSpeed 0.19.8's AutoEP keys that Loom does not act on, each accepted at the value that
// changes nothing here and refused otherwise, with the reason.
Status checkInertExpertKeys(ObjectReader& r) {
  // Tuning of DeepSpeed's own kernels and exchange, which Loom does not run: any value.
  for (const char* key : {"disable_triton_grouped_mm", "validate_folding_routing", "async_split_plan"}) {
    bool ignored = false;
    RETURN_IF_ERROR(r.readBool(key, &ignored));
  }
  for (const char* key : {"comm_num_sm", "comm_qp_margin", "comm_max_tokens_per_rank"}) {
    int64_t ignored = 0;
    RETURN_IF_ERROR(r.readInt(key, &ignored, false, 0, int64_t{1} << 40));
  }
  // Choices between DeepSpeed's implementations: their default ("auto", "comm") only.
  for (auto [key, only] : {std::pair{"score_apply", "auto"}, std::pair{"combine_impl", "auto"},
                           std::pair{"row_weighting_impl", "auto"}, std::pair{"comm_backend", "comm"}}) {
    std::string value = only;
    RETURN_IF_ERROR(r.readString(key, &value, false));
    if (value != only)
      return invalidArgument("{}: \"{}\" is not supported: Loom dispatches with its own all-to-all-v and weights the "
                             "rows after the experts (only \"{}\")",
                             r.pathOf(key), value, only);
  }
  // How DeepSpeed finds the MoE layers of a model it did not build. Loom builds the MoE families it
  // knows and finds their experts itself: null only.
  for (const char* key : {"moe_layer_pattern", "expert_pattern", "router_pattern", "expert_w1", "expert_w2",
                          "expert_w3", "num_experts_attr", "top_k_attr", "shared_experts_pattern",
                          "shared_experts_gate_pattern"}) {
    if (const json* v = r.find(key); v && !v->is_null())
      return invalidArgument("{}: not supported: Loom builds the MoE layers of the model families it knows (mixtral, "
                             "qwen2_moe, qwen3_moe, deepseek_v3) and finds their experts itself",
                             r.pathOf(key));
  }
  int64_t expertTensorParallel = 1;
  RETURN_IF_ERROR(r.readInt("expert_tensor_parallel_size", &expertTensorParallel, false, 1, kMaxRanks));
  if (expertTensorParallel != 1)
    return invalidArgument("deepspeed.expert_parallel.expert_tensor_parallel_size: {} is not supported: the experts "
                           "split over the tensor-parallel group as the dense MLPs do (tensor_parallel.autotp_size)",
                           expertTensorParallel);
  // DeepSpeed 0.19.8 refuses any value but null too: the load-balancing loss follows the model
  // config (router_aux_loss_coef).
  if (const json* v = r.find("load_balance_coeff"); v && !v->is_null())
    return invalidArgument("deepspeed.expert_parallel.load_balance_coeff: not supported (as in DeepSpeed 0.19.8): the "
                           "load-balancing loss follows the model config's output_router_logits and "
                           "router_aux_loss_coef");
  return Status::ok();
}

Status parseExpertParallel(const json& object, ExpertParallelConfig* ep) {
  ObjectReader r(object, "deepspeed.expert_parallel");
  RETURN_IF_ERROR(r.readBool("enabled", &ep->enabled));
  int64_t size = ep->size;
  RETURN_IF_ERROR(r.readInt("autoep_size", &size, false, 1, kMaxRanks));
  ep->size = static_cast<int>(size);
  RETURN_IF_ERROR(r.readString("preset_model", &ep->presetModel, false));
  static const std::set<std::string> kPresets{"mixtral", "qwen3_moe", "qwen3_5_moe", "deepseek_v2", "deepseek_v3"};
  // DeepSpeed 0.19.8's registry also has minimax_m3, whose model transformers 5.17 does not build.
  if (ep->presetModel == "minimax_m3")
    return invalidArgument("deepspeed.expert_parallel.preset_model: \"minimax_m3\" is a DeepSpeed preset for a model "
                           "transformers 5.17 does not build, so Loom does not offer it (mixtral, qwen3_moe, "
                           "qwen3_5_moe, deepseek_v2, deepseek_v3)");
  if (!ep->presetModel.empty() && !kPresets.count(ep->presetModel))
    return invalidArgument("deepspeed.expert_parallel.preset_model: \"{}\" is not a preset (mixtral, qwen3_moe, "
                           "qwen3_5_moe, deepseek_v2, deepseek_v3)",
                           ep->presetModel);
  RETURN_IF_ERROR(r.readBool("use_grouped_mm", &ep->useGroupedMm));
  RETURN_IF_ERROR(readOptionalBool(r, "route_norm", &ep->routeNorm));
  RETURN_IF_ERROR(r.readDouble("route_scale", &ep->routeScale, false, 1e-30, 1e30));
  RETURN_IF_ERROR(r.readString("score_func", &ep->scoreFunc, false));
  if (ep->scoreFunc != "auto" && ep->scoreFunc != "softmax" && ep->scoreFunc != "sigmoid")
    return invalidArgument("deepspeed.expert_parallel.score_func: must be auto, softmax or sigmoid, got \"{}\"",
                           ep->scoreFunc);
  std::optional<double> topK, groups, limited;
  RETURN_IF_ERROR(readNumberOrAuto(r, "top_k", true, 1, &topK));
  RETURN_IF_ERROR(readNumberOrAuto(r, "num_expert_groups", true, 1, &groups));
  RETURN_IF_ERROR(readNumberOrAuto(r, "num_limited_groups", true, 1, &limited));
  ep->topK = static_cast<int64_t>(topK.value_or(0));
  ep->numExpertGroups = static_cast<int64_t>(groups.value_or(0));
  ep->numLimitedGroups = static_cast<int64_t>(limited.value_or(0));
  if (ep->numExpertGroups && ep->numLimitedGroups > ep->numExpertGroups)
    return invalidArgument("deepspeed.expert_parallel.num_limited_groups: {} is above num_expert_groups {}",
                           ep->numLimitedGroups, ep->numExpertGroups);
  RETURN_IF_ERROR(readNumberOrAuto(r, "routed_scaling_factor", false, 1e-30, &ep->routedScalingFactor));
  RETURN_IF_ERROR(readOptionalBool(r, "has_shared_experts", &ep->hasSharedExperts));
  RETURN_IF_ERROR(r.readString("gate_up_impl", &ep->gateUpImpl, false));
  if (ep->gateUpImpl != "separate" && ep->gateUpImpl != "fused")
    return invalidArgument("deepspeed.expert_parallel.gate_up_impl: must be \"separate\" or \"fused\", got \"{}\"",
                           ep->gateUpImpl);
  if (ep->gateUpImpl == "fused" && !ep->useGroupedMm)
    return invalidArgument("deepspeed.expert_parallel.gate_up_impl: \"fused\" runs gate and up as one grouped GEMM, "
                           "but use_grouped_mm is false");
  if (const json* a = r.find("expert_activation"); a && !a->is_null()) {
    RETURN_IF_ERROR(r.readString("expert_activation", &ep->expertActivation, false));
    ExpertMlpConfig::Activation parsed;
    if (!parseExpertActivation(ep->expertActivation, &parsed))
      return invalidArgument("deepspeed.expert_parallel.expert_activation: \"{}\" is not one of swiglu, geglu_tanh, "
                             "swiglu_clamped, swiglu_oai",
                             ep->expertActivation);
  }
  if (!ep->enabled && ep->size > 1)
    return invalidArgument("deepspeed.expert_parallel.autoep_size: {} needs expert_parallel.enabled true", ep->size);
  if (!ep->enabled && (ep->gateUpImpl != "separate" || !ep->expertActivation.empty()))
    return invalidArgument("deepspeed.expert_parallel.{}: needs expert_parallel.enabled true (AutoEP's experts are "
                           "what it changes; autoep_size 1 keeps every expert on every rank)",
                           ep->gateUpImpl != "separate" ? "gate_up_impl" : "expert_activation");
  RETURN_IF_ERROR(checkInertExpertKeys(r));
  return r.rejectUnknown();
}

template <typename T>
json orNull(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json shapeToJson(const std::vector<TpShapeDim>& shape) {
  json out = json::array();
  for (const auto& d : shape) {
    if (!d.subParams.empty()) {
      out.push_back(d.subParams);
    } else if (d.count > 0) {
      out.push_back(d.count);
    } else {
      out.push_back(d.size);
    }
  }
  return out;
}

}  // namespace

Status parseParallelSections(ObjectReader& r, DeepSpeedConfig* c) {
  int64_t sp = 1;
  RETURN_IF_ERROR(r.readInt("sequence_parallel_size", &sp, false, 1, kMaxRanks));
  c->sequenceParallelSize = static_cast<int>(sp);
  // DeepSpeed's names for it: fp32, fp16, bf16.
  std::string commType = "fp32";
  RETURN_IF_ERROR(r.readString("seq_parallel_communication_data_type", &commType, false));
  if (commType == "fp32") {
    c->sequenceCommunicationType = Precision::kFp32;
  } else if (commType == "fp16") {
    c->sequenceCommunicationType = Precision::kFp16;
  } else if (commType == "bf16") {
    c->sequenceCommunicationType = Precision::kBf16;
  } else {
    return invalidArgument("deepspeed.seq_parallel_communication_data_type: \"{}\" is not one of fp32, fp16, bf16",
                           commType);
  }
  ASSIGN_OR_RETURN(const json* tp, r.readObject("tensor_parallel"));
  if (tp) RETURN_IF_ERROR(parseTensorParallel(*tp, &c->tensorParallel));
  ASSIGN_OR_RETURN(const json* ep, r.readObject("expert_parallel"));
  if (ep) RETURN_IF_ERROR(parseExpertParallel(*ep, &c->expertParallel));
  return Status::ok();
}

void parallelSectionsToJson(const DeepSpeedConfig& c, json& out) {
  const auto& tp = c.tensorParallel;
  json specs = json::array();
  for (const auto& s : tp.layerSpecs) {
    json spec{{"patterns", s.patterns},
              {"partition_type", s.split == TpSplit::kReplicated ? "skip" : tpSplitName(s.split)},
              {"gather_output", s.gatherOutput},
              {"grad_allreduce", s.gradAllreduce}};
    if (s.partitionDim) spec["partition_dim"] = *s.partitionDim;
    if (!s.shape.empty()) spec["shape"] = shapeToJson(s.shape);
    specs.push_back(std::move(spec));
  }
  out["tensor_parallel"] = {
      {"autotp_size", tp.size},
      {"partition_config",
       {{"use_default_specs", tp.useDefaultSpecs}, {"strict_mode", tp.strictMode}, {"layer_specs", specs}}}};
  const auto& ep = c.expertParallel;
  out["expert_parallel"] = {
      {"enabled", ep.enabled},
      {"autoep_size", ep.size},
      {"preset_model", ep.presetModel.empty() ? json(nullptr) : json(ep.presetModel)},
      {"use_grouped_mm", ep.useGroupedMm},
      {"route_norm", orNull(ep.routeNorm)},
      {"route_scale", ep.routeScale},
      {"score_func", ep.scoreFunc},
      {"top_k", ep.topK ? json(ep.topK) : json("auto")},
      {"num_expert_groups", ep.numExpertGroups ? json(ep.numExpertGroups) : json(nullptr)},
      {"num_limited_groups", ep.numLimitedGroups ? json(ep.numLimitedGroups) : json(nullptr)},
      {"routed_scaling_factor", ep.routedScalingFactor ? json(*ep.routedScalingFactor) : json("auto")},
      {"has_shared_experts", orNull(ep.hasSharedExperts)},
      {"gate_up_impl", ep.gateUpImpl},
      {"expert_activation", ep.expertActivation.empty() ? json(nullptr) : json(ep.expertActivation)},
  };
  out["sequence_parallel_size"] = c.sequenceParallelSize;
  out["seq_parallel_communication_data_type"] = c.sequenceCommunicationType == Precision::kFp32   ? "fp32"
                                                : c.sequenceCommunicationType == Precision::kFp16 ? "fp16"
                                                                                                  : "bf16";
}

}  // namespace loom::planner
