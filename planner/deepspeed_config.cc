#include "planner/deepspeed_config.h"

#include <filesystem>

#include <algorithm>
#include <map>

#include "planner/deepspeed_parallel.h"
#include "planner/json_reader.h"
#include "planner/mesh.h"

namespace loom::planner {

using nlohmann::json;

const char* optimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdamW: return "AdamW";
    case OptimizerType::kAdam: return "Adam";
    case OptimizerType::kLion: return "Lion";
    case OptimizerType::kAdagrad: return "Adagrad";
    case OptimizerType::kMuon: return "Muon";
  }
  return "?";
}

const char* nsMethodName(NsMethod method) { return method == NsMethod::kGram ? "gram" : "standard"; }

OptimizerConfig OptimizerConfig::auxiliary() const {
  if (type != OptimizerType::kMuon) return *this;
  OptimizerConfig adam = *this;
  adam.type = decoupledWeightDecay ? OptimizerType::kAdamW : OptimizerType::kAdam;
  adam.biasCorrection = true;
  return adam;
}

const char* schedulerTypeName(SchedulerType type) {
  switch (type) {
    case SchedulerType::kConstant: return "none";
    case SchedulerType::kWarmupLR: return "WarmupLR";
    case SchedulerType::kWarmupDecayLR: return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR: return "WarmupCosineLR";
  }
  return "?";
}

const char* precisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

namespace {

constexpr int64_t kMaxBatch = int64_t(1) << 40;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// DeepSpeed's MuonWithAuxAdam (engine._muon_param_groups): the shared lr, weight_decay,
// momentum and ns_method; muon_lr and adam_lr over lr for their half; betas and eps for the
// auxiliary Adam; per_head_muon. Each half keeps its own defaults where the config says nothing.
Status parseMuon(ObjectReader& p, OptimizerConfig* o) {
  MuonConfig& m = o->muon;
  o->lr = 3e-4;
  o->beta1 = 0.9;
  o->beta2 = 0.95;
  o->eps = 1e-10;
  double lr = -1;
  RETURN_IF_ERROR(p.readDouble("lr", &lr, false, 0, 1e6));
  if (lr >= 0) m.lr = o->lr = lr;
  RETURN_IF_ERROR(p.readDouble("muon_lr", &m.lr, false, 0, 1e6));
  RETURN_IF_ERROR(p.readDouble("adam_lr", &o->lr, false, 0, 1e6));
  RETURN_IF_ERROR(p.readDouble("weight_decay", &o->weightDecay, false, 0, 1e6));
  m.weightDecay = o->weightDecay;
  RETURN_IF_ERROR(p.readDouble("momentum", &m.momentum, false, 0, 1));
  if (m.momentum >= 1) return invalidArgument("{}: must be in [0, 1), got {}", p.pathOf("momentum"), m.momentum);
  std::string method = "gram";
  RETURN_IF_ERROR(p.readString("ns_method", &method, false));
  if (method != "gram" && method != "standard")
    return invalidArgument("{}: \"{}\" is not a Newton-Schulz method (gram or standard)", p.pathOf("ns_method"), method);
  m.nsMethod = method == "gram" ? NsMethod::kGram : NsMethod::kStandard;
  RETURN_IF_ERROR(p.readBool("per_head_muon", &m.perHead));
  std::vector<double> betas{o->beta1, o->beta2};
  RETURN_IF_ERROR(p.readDoubles("betas", &betas, 2));
  for (double b : betas) {
    if (b < 0 || b >= 1) return invalidArgument("{}: each must be in [0, 1), got {}", p.pathOf("betas"), b);
  }
  o->beta1 = betas[0];
  o->beta2 = betas[1];
  RETURN_IF_ERROR(p.readDouble("eps", &o->eps, false, 0, 1));
  // adam_w_mode: the auxiliary Adam's weight decay, decoupled (default) or an L2 term; Muon's own
  // is always decoupled. torch_adam picks DeepSpeed's implementation of that Adam, the same update.
  RETURN_IF_ERROR(p.readBool("adam_w_mode", &o->decoupledWeightDecay));
  RETURN_IF_ERROR(p.readBool("torch_adam", &o->torchAdam));
  return p.rejectUnknown();
}

Status parseOptimizer(const json& object, OptimizerConfig* o) {
  ObjectReader r(object, "deepspeed.optimizer");
  std::string type;
  RETURN_IF_ERROR(r.readString("type", &type, /*required=*/true));
  static const std::map<std::string, OptimizerType> kTypes{{"adamw", OptimizerType::kAdamW},
                                                           {"adam", OptimizerType::kAdam},
                                                           {"lion", OptimizerType::kLion},
                                                           {"adagrad", OptimizerType::kAdagrad},
                                                           {"muon", OptimizerType::kMuon}};
  auto it = kTypes.find(lower(type));
  if (it == kTypes.end())
    return invalidArgument(
        "deepspeed.optimizer.type: \"{}\" is not supported (supported: Adam, AdamW, Lion, Adagrad, Muon)", type);
  o->type = it->second;
  if (o->type == OptimizerType::kLion) o->beta2 = 0.99;
  if (o->type == OptimizerType::kAdagrad) {
    o->lr = 1e-2;
    o->eps = 1e-10;
  }
  ASSIGN_OR_RETURN(const json* params, r.readObject("params"));
  RETURN_IF_ERROR(r.rejectUnknown());
  static const json kNoParams = json::object();
  if (o->type == OptimizerType::kMuon) {
    ObjectReader p(params ? *params : kNoParams, "deepspeed.optimizer.params");
    return parseMuon(p, o);
  }
  if (!params) return Status::ok();

  ObjectReader p(*params, "deepspeed.optimizer.params");
  RETURN_IF_ERROR(p.readDouble("lr", &o->lr, false, 0, 1e6));
  RETURN_IF_ERROR(p.readDouble("weight_decay", &o->weightDecay, false, 0, 1e6));
  if (o->type != OptimizerType::kAdagrad) {
    std::vector<double> betas{o->beta1, o->beta2};
    RETURN_IF_ERROR(p.readDoubles("betas", &betas, 2));
    for (double b : betas) {
      if (b < 0 || b >= 1) return invalidArgument("deepspeed.optimizer.params.betas: each must be in [0, 1), got {}", b);
    }
    o->beta1 = betas[0];
    o->beta2 = betas[1];
  }
  if (o->type != OptimizerType::kLion) RETURN_IF_ERROR(p.readDouble("eps", &o->eps, false, 0, 1));
  if (o->type == OptimizerType::kAdam || o->type == OptimizerType::kAdamW) {
    RETURN_IF_ERROR(p.readBool("bias_correction", &o->biasCorrection));
    bool amsgrad = false;
    RETURN_IF_ERROR(p.readBool("amsgrad", &amsgrad));
    if (amsgrad) return invalidArgument("deepspeed.optimizer.params.amsgrad: true is not supported (as in DeepSpeed)");
    RETURN_IF_ERROR(p.readBool("torch_adam", &o->torchAdam));
    if (o->type == OptimizerType::kAdam) RETURN_IF_ERROR(p.readBool("adam_w_mode", &o->decoupledWeightDecay));
  }
  // Adagrad's weight decay is an L2 term, as in DeepSpeedCPUAdagrad and torch.
  if (o->type == OptimizerType::kAdagrad) o->decoupledWeightDecay = false;
  return p.rejectUnknown();
}

Status parseWarmupType(ObjectReader& p, SchedulerConfig* s) {
  std::string warmupType = "log";
  RETURN_IF_ERROR(p.readString("warmup_type", &warmupType, false));
  if (warmupType != "log" && warmupType != "linear")
    return invalidArgument("{}: must be \"log\" or \"linear\", got \"{}\"", p.pathOf("warmup_type"), warmupType);
  s->warmupLinear = warmupType == "linear";
  return Status::ok();
}

Status parseScheduler(const json& object, SchedulerConfig* s) {
  ObjectReader r(object, "deepspeed.scheduler");
  std::string type;
  RETURN_IF_ERROR(r.readString("type", &type, true));
  static const std::map<std::string, SchedulerType> kTypes{{"WarmupLR", SchedulerType::kWarmupLR},
                                                           {"WarmupDecayLR", SchedulerType::kWarmupDecayLR},
                                                           {"WarmupCosineLR", SchedulerType::kWarmupCosineLR}};
  auto it = kTypes.find(type);
  if (it == kTypes.end())
    return invalidArgument(
        "deepspeed.scheduler.type: \"{}\" is not supported (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR)", type);
  s->type = it->second;
  ASSIGN_OR_RETURN(const json* params, r.readObject("params"));
  RETURN_IF_ERROR(r.rejectUnknown());
  static const json kEmpty = json::object();
  ObjectReader p(params ? *params : kEmpty, "deepspeed.scheduler.params");
  RETURN_IF_ERROR(p.readWholeNumber("warmup_num_steps", &s->warmupNumSteps, false, 0, kMaxBatch));
  RETURN_IF_ERROR(parseWarmupType(p, s));
  int64_t lastBatchIteration = -1;
  RETURN_IF_ERROR(p.readWholeNumber("last_batch_iteration", &lastBatchIteration, false, -1, -1));
  if (s->type == SchedulerType::kWarmupCosineLR) {
    RETURN_IF_ERROR(p.readWholeNumber("total_num_steps", &s->totalNumSteps, true, 1, kMaxBatch));
    RETURN_IF_ERROR(p.readDouble("warmup_min_ratio", &s->warmupMinRatio, false, 0, 1));
    RETURN_IF_ERROR(p.readDouble("cos_min_ratio", &s->cosMinRatio, false, 0, 1));
  } else {
    RETURN_IF_ERROR(p.readDouble("warmup_min_lr", &s->warmupMinLr, false, 0, 1e6));
    double maxLr = -1;
    RETURN_IF_ERROR(p.readDouble("warmup_max_lr", &maxLr, false, 0, 1e6));
    if (maxLr >= 0) s->warmupMaxLr = maxLr;
    if (s->type == SchedulerType::kWarmupDecayLR)
      RETURN_IF_ERROR(p.readWholeNumber("total_num_steps", &s->totalNumSteps, true, 1, kMaxBatch));
  }
  if (s->totalNumSteps && s->totalNumSteps < s->warmupNumSteps)
    return invalidArgument("deepspeed.scheduler.params.total_num_steps: {} is below warmup_num_steps {}",
                           s->totalNumSteps, s->warmupNumSteps);
  return p.rejectUnknown();
}

Status parseFp16(const json& object, DeepSpeedConfig* c) {
  ObjectReader r(object, "deepspeed.fp16");
  bool enabled = false;
  RETURN_IF_ERROR(r.readBool("enabled", &enabled));
  auto& s = c->lossScale;
  RETURN_IF_ERROR(r.readDouble("loss_scale", &s.staticScale, false, 0, 1e30));
  int64_t power = s.initialScalePower, hysteresis = s.hysteresis;
  RETURN_IF_ERROR(r.readWholeNumber("initial_scale_power", &power, false, 0, 100));
  RETURN_IF_ERROR(r.readWholeNumber("loss_scale_window", &s.window, false, 1, kMaxBatch));
  RETURN_IF_ERROR(r.readWholeNumber("hysteresis", &hysteresis, false, 1, 1'000'000));
  RETURN_IF_ERROR(r.readBool("consecutive_hysteresis", &s.consecutiveHysteresis));
  RETURN_IF_ERROR(r.readDouble("min_loss_scale", &s.minScale, false, 1e-30, 1e30));
  s.initialScalePower = static_cast<int>(power);
  s.hysteresis = static_cast<int>(hysteresis);
  if (enabled) c->precision = Precision::kFp16;
  return r.rejectUnknown();
}

Status parseBf16(const json& object, const char* key, DeepSpeedConfig* c) {
  ObjectReader r(object, std::string("deepspeed.") + key);
  bool enabled = false;
  RETURN_IF_ERROR(r.readBool("enabled", &enabled));
  RETURN_IF_ERROR(r.readBool("check_grad_overflow", &c->bf16CheckGradOverflow));
  if (enabled) {
    if (c->precision == Precision::kFp16)
      return invalidArgument("deepspeed.{}.enabled: fp16 and bf16 cannot both be enabled", key);
    c->precision = Precision::kBf16;
  }
  return r.rejectUnknown();
}

Status parseOffload(const json& object, ZeroConfig* z) {
  ObjectReader r(object, "deepspeed.zero_optimization.offload_optimizer");
  RETURN_IF_ERROR(r.readString("device", &z->offloadOptimizer, false));
  if (z->offloadOptimizer != "none" && z->offloadOptimizer != "cpu")
    return invalidArgument("deepspeed.zero_optimization.offload_optimizer.device: \"{}\" is not supported (none, "
                           "cpu)",
                           z->offloadOptimizer);
  RETURN_IF_ERROR(r.readBool("pin_memory", &z->offloadPinMemory));
  RETURN_IF_ERROR(r.readDouble("ratio", &z->offloadRatio, false, 0, 1));
  if (z->offloadRatio != 1.0)
    return invalidArgument("deepspeed.zero_optimization.offload_optimizer.ratio: only 1.0 (the whole optimizer) is "
                           "supported, got {}",
                           z->offloadRatio);
  if (z->offloadOptimizer == "cpu" && z->stage == 0)
    return invalidArgument("deepspeed.zero_optimization.offload_optimizer: needs ZeRO stage 1, 2 or 3 (as in "
                           "DeepSpeed)");
  return r.rejectUnknown();
}

Status parseOffloadParam(const json& object, ZeroConfig* z) {
  ObjectReader r(object, "deepspeed.zero_optimization.offload_param");
  RETURN_IF_ERROR(r.readString("device", &z->offloadParam, false));
  if (z->offloadParam != "none" && z->offloadParam != "cpu")
    return invalidArgument("deepspeed.zero_optimization.offload_param.device: \"{}\" is not supported (none, cpu)",
                           z->offloadParam);
  RETURN_IF_ERROR(r.readBool("pin_memory", &z->offloadParamPinMemory));
  if (z->offloadParam == "cpu" && z->stage != 3)
    return invalidArgument("deepspeed.zero_optimization.offload_param: needs ZeRO stage 3, the stage that partitions "
                           "parameters (as in DeepSpeed); this config has stage {}",
                           z->stage);
  return r.rejectUnknown();
}

Status parseZero(const json& object, DeepSpeedConfig* c) {
  ObjectReader r(object, "deepspeed.zero_optimization");
  auto& z = c->zero;
  int64_t stage = 0;
  RETURN_IF_ERROR(r.readInt("stage", &stage, false, 0, 3));
  z.stage = static_cast<int>(stage);
  z.overlapComm = z.stage == 3;
  constexpr int64_t kMax = int64_t(1) << 50;
  RETURN_IF_ERROR(r.readBool("contiguous_gradients", &z.contiguousGradients));
  RETURN_IF_ERROR(r.readBool("reduce_scatter", &z.reduceScatter));
  // "auto" for these three is the HF Trainer's: sized from the model's hidden_size (sizedFor).
  auto readModelSized = [&](const char* key, int64_t* out, int64_t min) {
    const json* v = r.find(key);
    if (v && v->is_string() && v->get<std::string>() == "auto") {
      *out = kSizedFromModel;
      return Status::ok();
    }
    return r.readWholeNumber(key, out, false, min, kMax);
  };
  RETURN_IF_ERROR(readModelSized("reduce_bucket_size", &z.reduceBucketSize, 1));
  RETURN_IF_ERROR(r.readBool("allgather_partitions", &z.allgatherPartitions));
  RETURN_IF_ERROR(r.readWholeNumber("allgather_bucket_size", &z.allgatherBucketSize, false, 1, kMax));
  RETURN_IF_ERROR(r.readBool("overlap_comm", &z.overlapComm));
  RETURN_IF_ERROR(readModelSized("stage3_prefetch_bucket_size", &z.prefetchBucketSize, 0));
  RETURN_IF_ERROR(readModelSized("stage3_param_persistence_threshold", &z.paramPersistenceThreshold, 0));
  RETURN_IF_ERROR(r.readWholeNumber("stage3_model_persistence_threshold", &z.modelPersistenceThreshold, false, 0,
                                    INT64_MAX));
  RETURN_IF_ERROR(r.readWholeNumber("stage3_max_live_parameters", &z.maxLiveParameters, false, 0, kMax));
  RETURN_IF_ERROR(r.readWholeNumber("stage3_max_reuse_distance", &z.maxReuseDistance, false, 0, kMax));
  RETURN_IF_ERROR(r.readBool("stage3_gather_16bit_weights_on_model_save", &z.gather16BitWeightsOnModelSave));
  RETURN_IF_ERROR(r.readWholeNumber("sub_group_size", &z.subGroupSize, false, 1, kMax));
  ASSIGN_OR_RETURN(const json* offload, r.readObject("offload_optimizer"));
  if (offload) RETURN_IF_ERROR(parseOffload(*offload, &z));
  ASSIGN_OR_RETURN(const json* offloadParam, r.readObject("offload_param"));
  if (offloadParam) RETURN_IF_ERROR(parseOffloadParam(*offloadParam, &z));
  return r.rejectUnknown();
}

Status parseCommsLogger(const json& object, CommsLoggerSpec* spec) {
  ObjectReader l(object, "deepspeed.comms_logger");
  RETURN_IF_ERROR(l.readBool("enabled", &spec->enabled));
  RETURN_IF_ERROR(l.readBool("verbose", &spec->verbose));
  RETURN_IF_ERROR(l.readBool("prof_all", &spec->profAll));
  bool debug = false;  // DeepSpeed's caller-name tracing; accepted, it changes nothing here
  RETURN_IF_ERROR(l.readBool("debug", &debug));
  // DeepSpeed's op names, and what Loom calls the same operation.
  static const std::map<std::string, std::string> kOpNames{
      {"all_reduce", "all_reduce"},         {"all_gather", "all_gather"},
      {"all_gather_into_tensor", "all_gather"}, {"all_gather_base", "all_gather"},
      {"reduce_scatter", "reduce_scatter"}, {"reduce_scatter_tensor", "reduce_scatter"},
      {"reduce_scatter_base", "reduce_scatter"}, {"all_to_all", "all_to_all"},
      {"all_to_all_single", "all_to_all"},  {"broadcast", "broadcast"},
      {"send", "send"},                     {"recv", "recv"},
      {"barrier", "barrier"}};
  std::set<std::string> known;
  for (const auto& [name, ours] : kOpNames) known.insert(name);
  std::vector<std::string> ops;
  RETURN_IF_ERROR(l.readStrings("prof_ops", &ops, known));
  spec->profOps.clear();
  for (const auto& op : ops) spec->profOps.push_back(kOpNames.at(op));
  return l.rejectUnknown();
}

Status parseMonitor(const json& object, const std::string& key, MonitorConfig* spec) {
  ObjectReader m(object, "deepspeed." + key);
  RETURN_IF_ERROR(m.readBool("enabled", &spec->enabled));
  RETURN_IF_ERROR(m.readString("output_path", &spec->outputPath, false));
  RETURN_IF_ERROR(m.readString("job_name", &spec->jobName, false));
  if (spec->enabled && spec->jobName.find('/') != std::string::npos)
    return invalidArgument("deepspeed.{}.job_name: \"{}\" names a directory inside output_path: no '/' in it", key,
                           spec->jobName);
  return m.rejectUnknown();
}

Status parseWandb(const json& object, WandbConfig* w) {
  ObjectReader r(object, "deepspeed.wandb");
  RETURN_IF_ERROR(r.readBool("enabled", &w->enabled));
  RETURN_IF_ERROR(r.readString("group", &w->group, false));
  RETURN_IF_ERROR(r.readString("team", &w->team, false));
  RETURN_IF_ERROR(r.readString("project", &w->project, false));
  RETURN_IF_ERROR(r.readString("dir", &w->dir, false));
  if (w->enabled && w->project.empty()) return invalidArgument("deepspeed.wandb.project: empty (wandb needs a project)");
  return r.rejectUnknown();
}

Status parseFlopsProfiler(const json& object, FlopsProfilerConfig* f) {
  ObjectReader r(object, "deepspeed.flops_profiler");
  RETURN_IF_ERROR(r.readBool("enabled", &f->enabled));
  RETURN_IF_ERROR(r.readDouble("recompute_fwd_factor", &f->recomputeFwdFactor, false, 0, 1e6));
  RETURN_IF_ERROR(r.readWholeNumber("profile_step", &f->profileStep, false, 0, int64_t{1} << 40));
  RETURN_IF_ERROR(r.readInt("module_depth", &f->moduleDepth, false, -1, 1 << 20));
  RETURN_IF_ERROR(r.readWholeNumber("top_modules", &f->topModules, false, 1, 1 << 20));
  RETURN_IF_ERROR(r.readBool("detailed", &f->detailed));
  if (const json* file = r.find("output_file"); file && !file->is_null())
    RETURN_IF_ERROR(r.readString("output_file", &f->outputFile, false));
  return r.rejectUnknown();
}

Status parseActivationCheckpointing(const json& object, ActivationCheckpointingConfig* c) {
  ObjectReader a(object, "deepspeed.activation_checkpointing");
  c->enabled = true;
  bool partition = false, synchronize = false, profile = false;
  RETURN_IF_ERROR(a.readBool("partition_activations", &partition));
  if (partition)
    return invalidArgument("deepspeed.activation_checkpointing.partition_activations: true is not supported: each "
                           "tensor-parallel rank keeps its checkpointed inputs whole");
  RETURN_IF_ERROR(a.readBool("cpu_checkpointing", &c->cpuCheckpointing));
  // Contiguous buffers serve DeepSpeed's allocator; libtorch's caching allocator reuses the
  // kept inputs' blocks already. Accepted, no effect.
  RETURN_IF_ERROR(a.readBool("contiguous_memory_optimization", &c->contiguousMemoryOptimization));
  if (const json* n = a.find("number_checkpoints"); n && !n->is_null())
    RETURN_IF_ERROR(a.readInt("number_checkpoints", &c->numberCheckpoints, false, 1, int64_t{1} << 20));
  RETURN_IF_ERROR(a.readBool("synchronize_checkpoint_boundary", &synchronize));
  if (synchronize)
    return invalidArgument("deepspeed.activation_checkpointing.synchronize_checkpoint_boundary: true is not supported "
                           "(a debugging aid of DeepSpeed's; Loom's step profile shows where a step's time goes: "
                           "train.profile_step)");
  RETURN_IF_ERROR(a.readBool("profile", &profile));
  if (profile)
    return invalidArgument("deepspeed.activation_checkpointing.profile: true is not supported (train.profile_step "
                           "profiles a whole step, recomputation included)");
  return a.rejectUnknown();
}

// DeepSpeed's rule: given two of the three, derive the third; given one, accumulation is 1.
Status resolveBatchSizes(ObjectReader& r, int64_t dp, bool training, DeepSpeedConfig* c) {
  int64_t train = 0, micro = 0, gas = 0;
  RETURN_IF_ERROR(r.readWholeNumber("train_batch_size", &train, false, 1, kMaxBatch));
  RETURN_IF_ERROR(r.readWholeNumber("train_micro_batch_size_per_gpu", &micro, false, 1, kMaxBatch));
  RETURN_IF_ERROR(r.readWholeNumber("gradient_accumulation_steps", &gas, false, 1, kMaxBatch));
  if (!train && !micro) {
    if (training)
      return invalidArgument(
          "deepspeed.train_batch_size: either train_batch_size or train_micro_batch_size_per_gpu must be given");
    micro = 1;
  }
  auto notDivisible = [&](int64_t total, int64_t by, const char* what) {
    return invalidArgument("deepspeed.train_batch_size: {} is not divisible by {} = {}", total, what, by);
  };
  if (train && micro && gas) {
    // checked below
  } else if (train && micro) {
    if (train % (micro * dp)) return notDivisible(train, micro * dp, "train_micro_batch_size_per_gpu * data-parallel ranks");
    gas = train / (micro * dp);
  } else if (train && gas) {
    if (train % (gas * dp)) return notDivisible(train, gas * dp, "gradient_accumulation_steps * data-parallel ranks");
    micro = train / (gas * dp);
  } else if (micro && gas) {
    train = micro * gas * dp;
  } else if (train) {
    if (train % dp) return notDivisible(train, dp, "data-parallel ranks");
    gas = 1;
    micro = train / dp;
  } else {
    gas = 1;
    train = micro * dp;
  }
  if (train != micro * gas * dp)
    return invalidArgument(
        "deepspeed.train_batch_size: {} != train_micro_batch_size_per_gpu {} * gradient_accumulation_steps {} * "
        "data-parallel ranks {}",
        train, micro, gas, dp);
  c->trainBatchSize = train;
  c->microBatchSize = micro;
  c->gradientAccumulationSteps = gas;
  return Status::ok();
}

// A value sized from the model reads back as the "auto" it was given as.
json modelSized(int64_t value) { return value == kSizedFromModel ? json("auto") : json(value); }

}  // namespace

ZeroConfig ZeroConfig::sizedFor(int64_t hiddenSize) const {
  ZeroConfig z = *this;
  const int64_t square = hiddenSize * hiddenSize;
  if (z.reduceBucketSize == kSizedFromModel) z.reduceBucketSize = std::max<int64_t>(square, 1);
  if (z.prefetchBucketSize == kSizedFromModel) z.prefetchBucketSize = static_cast<int64_t>(0.9 * double(square));
  if (z.paramPersistenceThreshold == kSizedFromModel) z.paramPersistenceThreshold = 10 * hiddenSize;
  return z;
}

StatusOr<DeepSpeedConfig> parseDeepSpeedConfig(const json& object, int64_t world, bool training) {
  if (!object.is_object()) return invalidArgument("deepspeed: must be a JSON object, got {}", object.type_name());
  DeepSpeedConfig c;
  ObjectReader r(object, "deepspeed");
  RETURN_IF_ERROR(parseParallelSections(r, &c));
  // The mesh decides whether the world splits into tp x sp x dp (and ep into dp x sp); the batch
  // triple counts its data-parallel ranks.
  ASSIGN_OR_RETURN(Mesh mesh, Mesh::create(static_cast<int>(world), c.tensorParallel.ranks(), c.sequenceParallelSize,
                                           c.expertParallel.ranks()));
  c.dataParallelSize = mesh.dp();
  RETURN_IF_ERROR(resolveBatchSizes(r, mesh.dp(), training, &c));
  ASSIGN_OR_RETURN(const json* optimizer, r.readObject("optimizer"));
  if (optimizer) {
    RETURN_IF_ERROR(parseOptimizer(*optimizer, &c.optimizer));
  } else if (training) {
    return invalidArgument("deepspeed.optimizer: required for a train job (e.g. {{\"type\": \"AdamW\", \"params\": "
                           "{{\"lr\": 3e-4}}}})");
  }
  ASSIGN_OR_RETURN(const json* scheduler, r.readObject("scheduler"));
  if (scheduler) RETURN_IF_ERROR(parseScheduler(*scheduler, &c.scheduler));
  ASSIGN_OR_RETURN(const json* fp16, r.readObject("fp16"));
  if (fp16) RETURN_IF_ERROR(parseFp16(*fp16, &c));
  for (const char* key : {"bf16", "bfloat16"}) {
    ASSIGN_OR_RETURN(const json* bf16, r.readObject(key));
    if (bf16) RETURN_IF_ERROR(parseBf16(*bf16, key, &c));
  }
  RETURN_IF_ERROR(r.readDouble("gradient_clipping", &c.gradientClipping, false, 0, 1e30));
  RETURN_IF_ERROR(r.readWholeNumber("steps_per_print", &c.stepsPerPrint, false, 1, kMaxBatch));
  RETURN_IF_ERROR(r.readBool("wall_clock_breakdown", &c.wallClockBreakdown));
  ASSIGN_OR_RETURN(const json* zero, r.readObject("zero_optimization"));
  if (zero) RETURN_IF_ERROR(parseZero(*zero, &c));
  ASSIGN_OR_RETURN(const json* logger, r.readObject("comms_logger"));
  if (logger) RETURN_IF_ERROR(parseCommsLogger(*logger, &c.commsLogger));
  for (auto [key, monitor] : {std::pair{"tensorboard", &c.tensorboard}, std::pair{"csv_monitor", &c.csvMonitor}}) {
    ASSIGN_OR_RETURN(const json* section, r.readObject(key));
    if (section) RETURN_IF_ERROR(parseMonitor(*section, key, monitor));
  }
  ASSIGN_OR_RETURN(const json* wandb, r.readObject("wandb"));
  if (wandb) RETURN_IF_ERROR(parseWandb(*wandb, &c.wandb));
  ASSIGN_OR_RETURN(const json* profiler, r.readObject("flops_profiler"));
  if (profiler) RETURN_IF_ERROR(parseFlopsProfiler(*profiler, &c.flopsProfiler));
  ASSIGN_OR_RETURN(const json* checkpointing, r.readObject("activation_checkpointing"));
  if (checkpointing) RETURN_IF_ERROR(parseActivationCheckpointing(*checkpointing, &c.activationCheckpointing));
  for (auto it = object.begin(); it != object.end(); ++it) {
    static const std::set<std::string> kKnown{
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer",
        "scheduler", "fp16", "bf16", "bfloat16", "gradient_clipping", "steps_per_print", "zero_optimization",
        "comms_logger", "tensor_parallel", "expert_parallel", "sequence_parallel_size",
        "seq_parallel_communication_data_type", "activation_checkpointing", "tensorboard", "csv_monitor", "wandb",
        "wall_clock_breakdown", "flops_profiler"};
    if (!kKnown.count(it.key()))
      return invalidArgument("deepspeed.{}: not supported by this version (supported: {})", it.key(),
                             "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps, "
                             "optimizer, scheduler, fp16, bf16, gradient_clipping, steps_per_print, "
                             "zero_optimization, comms_logger, tensor_parallel, expert_parallel, "
                             "sequence_parallel_size, seq_parallel_communication_data_type, "
                             "activation_checkpointing, tensorboard, csv_monitor, wandb, wall_clock_breakdown, "
                             "flops_profiler");
  }
  return c;
}

std::string MonitorConfig::directory() const {
  return (std::filesystem::path(outputPath) / jobName).lexically_normal().string();
}

void resolveMonitorPaths(json& deepspeed, const std::string& baseDir) {
  if (!deepspeed.is_object() || baseDir.empty()) return;
  for (const char* key : {"tensorboard", "csv_monitor"}) {
    auto section = deepspeed.find(key);
    if (section == deepspeed.end() || !section->is_object()) continue;
    auto path = section->find("output_path");
    if (path != section->end() && !path->is_string()) continue;  // the parser names the wrong type
    const std::string p = path == section->end() ? std::string() : path->get<std::string>();
    if (p.empty() || p[0] != '/') (*section)["output_path"] = (std::filesystem::path(baseDir) / p).lexically_normal().string();
  }
  auto wandb = deepspeed.find("wandb");
  if (wandb != deepspeed.end() && wandb->is_object()) {
    auto dir = wandb->find("dir");
    if (dir != wandb->end() && !dir->is_string()) return;  // the parser names the wrong type
    const std::string d = dir == wandb->end() ? std::string() : dir->get<std::string>();
    if (d.empty() || d[0] != '/') {
      const std::filesystem::path base(baseDir);
      (*wandb)["dir"] = (d.empty() ? base : base / d).lexically_normal().string();
    }
  }
  auto profiler = deepspeed.find("flops_profiler");
  if (profiler != deepspeed.end() && profiler->is_object()) {
    auto file = profiler->find("output_file");
    if (file != profiler->end() && file->is_string() && !file->get<std::string>().empty() &&
        file->get<std::string>()[0] != '/')
      (*file) = (std::filesystem::path(baseDir) / file->get<std::string>()).lexically_normal().string();
  }
}

bool DeepSpeedConfig::skipsNonFiniteSteps() const {
  switch (precision) {
    case Precision::kFp16:
      return true;
    case Precision::kBf16:
      return zero.stage == 0 || (zero.stage < 3 && bf16CheckGradOverflow);
    case Precision::kFp32:
      return false;
  }
  return false;
}

json DeepSpeedConfig::toJson() const {
  const auto& o = optimizer;
  json optimizerParams{{"lr", o.lr}, {"weight_decay", o.weightDecay}};
  if (o.type != OptimizerType::kAdagrad) optimizerParams["betas"] = {o.beta1, o.beta2};
  if (o.type != OptimizerType::kLion) optimizerParams["eps"] = o.eps;
  if (o.type == OptimizerType::kAdam || o.type == OptimizerType::kAdamW)
    optimizerParams["bias_correction"] = o.biasCorrection;
  if (o.type == OptimizerType::kAdam || o.type == OptimizerType::kMuon)
    optimizerParams["adam_w_mode"] = o.decoupledWeightDecay;
  if (o.torchAdam) optimizerParams["torch_adam"] = true;
  if (o.type == OptimizerType::kMuon) {
    optimizerParams.erase("lr");
    optimizerParams.update({{"adam_lr", o.lr},
                            {"muon_lr", o.muon.lr},
                            {"momentum", o.muon.momentum},
                            {"ns_method", nsMethodName(o.muon.nsMethod)},
                            {"per_head_muon", o.muon.perHead}});
  }
  json j{
      {"train_batch_size", trainBatchSize},
      {"train_micro_batch_size_per_gpu", microBatchSize},
      {"gradient_accumulation_steps", gradientAccumulationSteps},
      {"optimizer", {{"type", optimizerTypeName(o.type)}, {"params", optimizerParams}}},
      {"gradient_clipping", gradientClipping},
      {"steps_per_print", stepsPerPrint},
      {"wall_clock_breakdown", wallClockBreakdown},
      {"zero_optimization",
       {{"stage", zero.stage},
        {"contiguous_gradients", zero.contiguousGradients},
        {"reduce_scatter", zero.reduceScatter},
        {"reduce_bucket_size", modelSized(zero.reduceBucketSize)},
        {"allgather_partitions", zero.allgatherPartitions},
        {"allgather_bucket_size", zero.allgatherBucketSize},
        {"overlap_comm", zero.overlapComm},
        {"stage3_prefetch_bucket_size", modelSized(zero.prefetchBucketSize)},
        {"stage3_param_persistence_threshold", modelSized(zero.paramPersistenceThreshold)},
        {"stage3_model_persistence_threshold", zero.modelPersistenceThreshold},
        {"stage3_max_live_parameters", zero.maxLiveParameters},
        {"stage3_max_reuse_distance", zero.maxReuseDistance},
        {"stage3_gather_16bit_weights_on_model_save", zero.gather16BitWeightsOnModelSave},
        {"sub_group_size", zero.subGroupSize},
        {"offload_optimizer",
         {{"device", zero.offloadOptimizer}, {"pin_memory", zero.offloadPinMemory}, {"ratio", zero.offloadRatio}}},
        {"offload_param", {{"device", zero.offloadParam}, {"pin_memory", zero.offloadParamPinMemory}}}}},
      {"fp16",
       {{"enabled", precision == Precision::kFp16},
        {"loss_scale", lossScale.staticScale},
        {"initial_scale_power", lossScale.initialScalePower},
        {"loss_scale_window", lossScale.window},
        {"hysteresis", lossScale.hysteresis},
        {"consecutive_hysteresis", lossScale.consecutiveHysteresis},
        {"min_loss_scale", lossScale.minScale}}},
      {"bf16", {{"enabled", precision == Precision::kBf16}, {"check_grad_overflow", bf16CheckGradOverflow}}},
      {"comms_logger",
       {{"enabled", commsLogger.enabled},
        {"verbose", commsLogger.verbose},
        {"prof_all", commsLogger.profAll},
        {"prof_ops", commsLogger.profOps}}},
      {"tensorboard",
       {{"enabled", tensorboard.enabled}, {"output_path", tensorboard.outputPath}, {"job_name", tensorboard.jobName}}},
      {"csv_monitor",
       {{"enabled", csvMonitor.enabled}, {"output_path", csvMonitor.outputPath}, {"job_name", csvMonitor.jobName}}},
  };
  // Only when on: its `dir` is Loom's, which DeepSpeed's own parser would refuse.
  if (wandb.enabled)
    j["wandb"] = {{"enabled", true}, {"group", wandb.group}, {"team", wandb.team}, {"project", wandb.project},
                  {"dir", wandb.dir}};
  if (flopsProfiler.enabled) {
    const auto& f = flopsProfiler;
    j["flops_profiler"] = {{"enabled", true},
                           {"recompute_fwd_factor", f.recomputeFwdFactor},
                           {"profile_step", f.profileStep},
                           {"module_depth", f.moduleDepth},
                           {"top_modules", f.topModules},
                           {"detailed", f.detailed},
                           {"output_file", f.outputFile.empty() ? json(nullptr) : json(f.outputFile)}};
  }
  if (scheduler.type != SchedulerType::kConstant) {
    const auto& s = scheduler;
    json params{{"warmup_num_steps", s.warmupNumSteps}, {"warmup_type", s.warmupLinear ? "linear" : "log"}};
    if (s.type == SchedulerType::kWarmupCosineLR) {
      params.update({{"total_num_steps", s.totalNumSteps},
                     {"warmup_min_ratio", s.warmupMinRatio},
                     {"cos_min_ratio", s.cosMinRatio}});
    } else {
      params["warmup_min_lr"] = s.warmupMinLr;
      if (s.warmupMaxLr) params["warmup_max_lr"] = *s.warmupMaxLr;
      if (s.type == SchedulerType::kWarmupDecayLR) params["total_num_steps"] = s.totalNumSteps;
    }
    j["scheduler"] = {{"type", schedulerTypeName(s.type)}, {"params", params}};
  }
  if (activationCheckpointing.enabled) {
    const auto& a = activationCheckpointing;
    j["activation_checkpointing"] = {
        {"cpu_checkpointing", a.cpuCheckpointing},
        {"contiguous_memory_optimization", a.contiguousMemoryOptimization},
        {"number_checkpoints", a.numberCheckpoints ? json(a.numberCheckpoints) : json(nullptr)}};
  }
  parallelSectionsToJson(*this, j);
  return j;
}

}  // namespace loom::planner
