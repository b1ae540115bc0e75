#include "planner/job_spec.h"

#include "common/files.h"
#include "kernels/plugin_name.h"
#include "planner/deepspeed_auto.h"
#include "planner/deepspeed_keys.h"
#include "planner/json_reader.h"

#include <cctype>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <tuple>

namespace loom::planner {

using nlohmann::json;

namespace {

// Every job kind, once: its name, whether it is compiled into a Plan, and its spec's sections.
// Adding a kind is adding a row here (and its runner in worker/job_runners.cc).
constexpr JobKindInfo kJobKinds[] = {
    {.kind = JobKind::kProbe, .name = "probe", .hasPlan = false, .model = false, .data = false, .section = "probe",
     .sectionRequired = false},
    {.kind = JobKind::kTrain, .name = "train", .hasPlan = true, .model = true, .data = true, .section = "train",
     .sectionRequired = true},
    {.kind = JobKind::kEval, .name = "eval", .hasPlan = true, .model = true, .data = true, .section = "eval",
     .sectionRequired = false},
    {.kind = JobKind::kConvert, .name = "convert", .hasPlan = false, .model = false, .data = false, .section = "convert",
     .sectionRequired = true},
    {.kind = JobKind::kRollout, .name = "rollout", .hasPlan = true, .model = true, .data = false, .section = "rollout",
     .sectionRequired = true},
};

}  // namespace

const JobKindInfo& jobKindInfo(JobKind kind) {
  for (const auto& info : kJobKinds)
    if (info.kind == kind) return info;
  return kJobKinds[0];  // every JobKind has a row above
}

const JobKindInfo* jobKindNamed(const std::string& name) {
  for (const auto& info : kJobKinds)
    if (name == info.name) return &info;
  return nullptr;
}

std::string jobKindNames() {
  std::string out;
  for (const auto& info : kJobKinds) out += std::string(out.empty() ? "" : ", ") + info.name;
  return out;
}

const char* jobKindName(JobKind kind) { return jobKindInfo(kind).name; }

const char* deviceKindName(DeviceKind device) {
  return device == DeviceKind::kCuda ? "cuda" : "cpu";
}

namespace {

Status parseResources(const json& object, JobSpec* spec) {
  ObjectReader r(object, "resources");
  int64_t ranks = 0;
  RETURN_IF_ERROR(r.readInt("ranks", &ranks, /*required=*/true, 1, 65536));
  spec->ranks = static_cast<int>(ranks);
  std::string device = "cpu";
  RETURN_IF_ERROR(r.readString("device", &device, false));
  if (device == "cpu") {
    spec->device = DeviceKind::kCpu;
  } else if (device == "cuda") {
    spec->device = DeviceKind::kCuda;
  } else {
    return invalidArgument("resources.device: must be \"cpu\" or \"cuda\", got \"{}\"", device);
  }
  spec->deviceMemoryGb = spec->device == DeviceKind::kCuda ? kDefaultCudaMemoryGb : 0;
  RETURN_IF_ERROR(r.readDouble("device_memory_gb", &spec->deviceMemoryGb, false, 0.001, 1e6));
  return r.rejectUnknown();
}

const std::set<std::string> kCollectiveOps{"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v",
                                           "broadcast"};

Status parseCollectives(const json& object, CollectivesSpec* c) {
  ObjectReader r(object, "probe.collectives");
  RETURN_IF_ERROR(r.readStrings("ops", &c->ops, kCollectiveOps));
  int64_t iterations = c->iterations, warmup = c->warmup, repeats = c->repeats;
  RETURN_IF_ERROR(r.readInt("min_bytes", &c->minBytes, false, 1, int64_t(1) << 34));
  RETURN_IF_ERROR(r.readInt("max_bytes", &c->maxBytes, false, 1, int64_t(1) << 34));
  RETURN_IF_ERROR(r.readInt("iterations", &iterations, false, 1, 100'000));
  RETURN_IF_ERROR(r.readInt("warmup", &warmup, false, 0, 100'000));
  RETURN_IF_ERROR(r.readInt("repeats", &repeats, false, 1, 1'000));
  RETURN_IF_ERROR(r.readString("dtype", &c->dtype, false));
  RETURN_IF_ERROR(r.readBool("shared_memory", &c->sharedMemory));
  static const std::set<std::string> kDtypes{"float32", "bfloat16", "float16", "int64"};
  if (!kDtypes.count(c->dtype))
    return invalidArgument("probe.collectives.dtype: must be float32, bfloat16, float16 or int64, got \"{}\"", c->dtype);
  if (c->minBytes > c->maxBytes)
    return invalidArgument("probe.collectives.min_bytes: {} is above max_bytes {}", c->minBytes, c->maxBytes);
  if (c->ops.empty()) return invalidArgument("probe.collectives.ops: must name at least one op");
  c->iterations = static_cast<int>(iterations);
  c->warmup = static_cast<int>(warmup);
  c->repeats = static_cast<int>(repeats);
  return r.rejectUnknown();
}

Status parseProbe(const json& object, JobSpec* spec) {
  ObjectReader r(object, "probe");
  int64_t ticks = spec->probe.ticks, tickMs = spec->probe.tickMs;
  RETURN_IF_ERROR(r.readInt("ticks", &ticks, false, 0, 1'000'000));
  RETURN_IF_ERROR(r.readInt("tick_ms", &tickMs, false, 0, 3'600'000));
  spec->probe.ticks = static_cast<int>(ticks);
  spec->probe.tickMs = static_cast<int>(tickMs);
  RETURN_IF_ERROR(r.readBool("kernels", &spec->probe.kernels));
  ASSIGN_OR_RETURN(const json* collectives, r.readObject("collectives"));
  if (collectives) {
    spec->probe.collectives.emplace();
    RETURN_IF_ERROR(parseCollectives(*collectives, &*spec->probe.collectives));
  }
  return r.rejectUnknown();
}

Status parseModel(const json& object, JobSpec* spec) {
  ObjectReader r(object, "model");
  RETURN_IF_ERROR(r.readString("config", &spec->model.config, /*required=*/true));
  RETURN_IF_ERROR(r.readString("weights", &spec->model.weights, false));
  RETURN_IF_ERROR(r.readInt("init_seed", &spec->model.initSeed, false, 0, INT64_MAX));
  RETURN_IF_ERROR(r.readInt("loss_block_rows", &spec->model.lossBlockRows, false, 0, int64_t(1) << 40));
  return r.rejectUnknown();
}

Status parseData(const json& object, JobSpec* spec) {
  ObjectReader r(object, "data");
  RETURN_IF_ERROR(r.readString("train", &spec->data.train, spec->kind == JobKind::kTrain));
  RETURN_IF_ERROR(r.readString("eval", &spec->data.eval, spec->kind == JobKind::kEval));
  RETURN_IF_ERROR(r.readInt("seq_len", &spec->data.seqLen, true, 1, 1 << 24));
  RETURN_IF_ERROR(r.readInt("seed", &spec->data.seed, false, 0, INT64_MAX));
  RETURN_IF_ERROR(r.readBool("pack_documents", &spec->data.packDocuments));
  if (const json* format = r.find("format")) {
    ASSIGN_OR_RETURN(spec->data.format, parseDataFormat(*format));
  }
  RETURN_IF_ERROR(r.readString("rewards", &spec->data.rewards, false));
  if (const json* reward = r.find("reward")) {
    ASSIGN_OR_RETURN(spec->data.reward, parseRewardRule(*reward));
  }
  const bool rollout = spec->data.format == DataFormat::kRollout;
  if (!rollout && (!spec->data.rewards.empty() || spec->data.reward.kind != RewardRule::Kind::kNone))
    return invalidArgument("data.{}: scores rollout data; set data.format to \"rollout\" with data.train a rollout's "
                           "results file",
                           spec->data.rewards.empty() ? "reward" : "rewards");
  if (rollout && spec->data.packDocuments)
    return invalidArgument("data.pack_documents: applies to token files; rollout data is one sample per row");
  if (rollout && !spec->data.rewards.empty() && spec->data.reward.kind != RewardRule::Kind::kNone)
    return invalidArgument("data.reward: give either a rule or data.rewards, a scorer's file, not both");
  return r.rejectUnknown();
}

Status parseTrain(const json& object, JobSpec* spec) {
  ObjectReader r(object, "train");
  auto& t = spec->train;
  RETURN_IF_ERROR(r.readInt("steps", &t.steps, true, 1, int64_t(1) << 40));
  RETURN_IF_ERROR(r.readInt("eval_every", &t.evalEvery, false, 0, int64_t(1) << 40));
  RETURN_IF_ERROR(r.readInt("eval_batches", &t.evalBatches, false, 1, int64_t(1) << 30));
  RETURN_IF_ERROR(r.readInt("checkpoint_every", &t.checkpointEvery, false, 0, int64_t(1) << 40));
  RETURN_IF_ERROR(r.readString("checkpoint_dir", &t.checkpointDir, false));
  RETURN_IF_ERROR(r.readBool("resume", &t.resume));
  RETURN_IF_ERROR(r.readBool("resume_optimizer", &t.resumeOptimizer));
  RETURN_IF_ERROR(r.readInt("keep_checkpoints", &t.keepCheckpoints, false, 1, int64_t(1) << 20));
  RETURN_IF_ERROR(r.readStrings("frozen_parameters", &t.frozenParameters, {}));
  for (size_t i = 0; i < t.frozenParameters.size(); ++i) {
    try {
      std::regex check(t.frozenParameters[i]);
    } catch (const std::regex_error& e) {
      return invalidArgument("train.frozen_parameters[{}]: \"{}\" is not a regular expression: {}", i,
                             t.frozenParameters[i], e.what());
    }
  }
  RETURN_IF_ERROR(r.readInt("profile_step", &t.profileStep, false, 0, int64_t(1) << 40));
  RETURN_IF_ERROR(r.readBool("gradient_checkpointing", &t.gradientCheckpointing));
  if (t.profileStep > t.steps)
    return invalidArgument("train.profile_step: {} is past the last step (train.steps is {})", t.profileStep, t.steps);
  if (t.evalEvery > 0 && spec->data.eval.empty())
    return invalidArgument("train.eval_every: {} needs data.eval, the token file to evaluate on", t.evalEvery);
  if (t.checkpointEvery > 0 && t.checkpointDir.empty())
    return invalidArgument("train.checkpoint_every: {} needs train.checkpoint_dir", t.checkpointEvery);
  if (const json* loss = r.find("loss")) {
    ASSIGN_OR_RETURN(t.loss, parseLossSpec(*loss));
  }
  if (t.loss.kind != LossSpec::Kind::kCrossEntropy && spec->data.format != DataFormat::kRollout)
    return invalidArgument("train.loss: {} trains on response tokens: set data.format to \"rollout\" with data.train "
                           "a rollout's results file",
                           lossKindName(t.loss.kind));
  if (t.loss.kind == LossSpec::Kind::kPolicyGradient && t.loss.advantage == AdvantageKind::kGiven &&
      spec->data.reward.kind != RewardRule::Kind::kNone)
    return invalidArgument("data.reward: train.loss.advantage is \"given\", which takes the lines' own advantages, "
                           "not rewards");
  return r.rejectUnknown();
}

Status parseKernels(const json& object, JobSpec* spec) {
  ObjectReader r(object, "kernels");
  RETURN_IF_ERROR(r.readStrings("plugins", &spec->kernelPlugins, {}));
  for (size_t i = 0; i < spec->kernelPlugins.size(); ++i)
    if (kernels::pluginShortName(spec->kernelPlugins[i]).empty())
      return invalidArgument("kernels.plugins[{}]: \"{}\" is not a plugin name: plugins load only from the nodes' "
                             "kernel directories (loomd --kernel-dir); name one, e.g. \"cuda\" for "
                             "libloom_kernels_cuda.so",
                             i, spec->kernelPlugins[i]);
  return r.rejectUnknown();
}

Status parseEval(const json& object, JobSpec* spec) {
  ObjectReader r(object, "eval");
  RETURN_IF_ERROR(r.readInt("max_batches", &spec->eval.maxBatches, false, 0, int64_t(1) << 40));
  RETURN_IF_ERROR(r.readString("logprobs_output", &spec->eval.logprobsOutput, false));
  RETURN_IF_ERROR(r.readBool("entropy", &spec->eval.entropy));
  RETURN_IF_ERROR(r.readString("kl_reference", &spec->eval.klReference, false));
  return r.rejectUnknown();
}

// "5GB", "500MB", "2GiB" or a number of bytes, as HF's max_shard_size reads them (KB, MB, GB:
// powers of 1000; KiB, MiB, GiB: of 1024).
StatusOr<int64_t> parseByteSize(const json& value, const std::string& field) {
  if (value.is_number_integer() && value.get<int64_t>() > 0) return value.get<int64_t>();
  if (!value.is_string()) return invalidArgument("{}: a size in bytes or a string such as \"5GB\"", field);
  const std::string text = value.get<std::string>();
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  static const std::map<std::string, double> kUnits{{"", 1},         {"B", 1},         {"KB", 1e3},
                                                    {"MB", 1e6},     {"GB", 1e9},      {"TB", 1e12},
                                                    {"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", double(1 << 30)}};
  auto unit = kUnits.find(text.substr(digits));
  double number = 0;
  try {
    number = digits ? std::stod(text.substr(0, digits)) : 0;
  } catch (const std::exception&) {
    number = 0;
  }
  if (unit == kUnits.end() || number <= 0)
    return invalidArgument("{}: \"{}\" is not a size (a number and B, KB, MB, GB, TB, KiB, MiB or GiB)", field, text);
  return static_cast<int64_t>(number * unit->second);
}

Status parseConvertLayout(const json& object, ConvertLayout* layout) {
  ObjectReader r(object, "convert.layout");
  int64_t ranks = 0, stage = -1, tp = 0, sp = 0, ep = 0;
  RETURN_IF_ERROR(r.readInt("ranks", &ranks, true, 1, 65536));
  RETURN_IF_ERROR(r.readInt("zero_stage", &stage, false, 0, 3));
  RETURN_IF_ERROR(r.readInt("autotp_size", &tp, false, 1, 65536));
  RETURN_IF_ERROR(r.readInt("sequence_parallel_size", &sp, false, 1, 65536));
  RETURN_IF_ERROR(r.readInt("autoep_size", &ep, false, 1, 65536));
  int64_t param = -1, model = -1;
  RETURN_IF_ERROR(r.readInt("stage3_param_persistence_threshold", &param, false, 0, INT64_MAX));
  RETURN_IF_ERROR(r.readInt("stage3_model_persistence_threshold", &model, false, 0, INT64_MAX));
  *layout = {.ranks = static_cast<int>(ranks),
             .zeroStage = static_cast<int>(stage),
             .tensorParallel = static_cast<int>(tp),
             .sequenceParallel = static_cast<int>(sp),
             .expertParallel = static_cast<int>(ep),
             .paramPersistenceThreshold = param,
             .modelPersistenceThreshold = model};
  return r.rejectUnknown();
}

Status parseConvert(const json& object, JobSpec* spec) {
  ObjectReader r(object, "convert");
  ConvertSpec& c = spec->convert;
  RETURN_IF_ERROR(r.readString("from", &c.from, true));
  RETURN_IF_ERROR(r.readString("to", &c.to, false));
  RETURN_IF_ERROR(r.readString("output", &c.output, true));
  RETURN_IF_ERROR(r.readString("dtype", &c.dtype, false));
  RETURN_IF_ERROR(r.readString("config", &c.modelConfig, false));
  if (const json* size = r.find("shard_size")) {
    ASSIGN_OR_RETURN(c.shardBytes, parseByteSize(*size, "convert.shard_size"));
  }
  if (c.to != "hf" && c.to != "loom" && c.to != "deepspeed_universal")
    return invalidArgument("convert.to: \"{}\" is not one of hf, loom, deepspeed_universal", c.to);
  if (!c.modelConfig.empty() && c.to != "loom")
    return invalidArgument("convert.config: only a conversion to loom reads the model's config (convert.to is {})", c.to);
  ASSIGN_OR_RETURN(const json* layout, r.readObject("layout"));
  if (layout) {
    if (c.to != "loom")
      return invalidArgument("convert.layout: only a conversion to loom has a layout (convert.to is {})", c.to);
    RETURN_IF_ERROR(parseConvertLayout(*layout, &c.layout));
  } else if (c.to == "loom") {
    return invalidArgument("convert.layout: a conversion to loom needs the layout to write for (at least its ranks)");
  }
  if (c.dtype != "keep" && c.dtype != "fp32" && c.dtype != "bf16")
    return invalidArgument("convert.dtype: \"{}\" is not one of keep, fp32, bf16", c.dtype);
  // A training checkpoint keeps its state in fp32, in files its layout fixes.
  if (c.to != "hf" && c.dtype != "keep")
    return invalidArgument("convert.dtype: only a conversion to hf has a dtype (convert.to is {})", c.to);
  if (c.to != "hf" && r.find("shard_size"))
    return invalidArgument("convert.shard_size: only a conversion to hf is cut into shards (convert.to is {})", c.to);
  if (c.from.empty() || c.output.empty()) return invalidArgument("convert.{}: must not be empty", c.from.empty() ? "from" : "output");
  return r.rejectUnknown();
}

Status parseRollout(const json& object, JobSpec* spec) { return parseRolloutSpec(object, &spec->rollout); }

// A rollout's dtype is its own (rollout.dtype), not a training precision: "auto" is bfloat16 on
// cuda and float32 on cpu. The Plan carries it as the precision, as for the other kinds.
Status resolveRolloutDtype(const json* deepspeed, JobSpec* spec) {
  std::string& dtype = spec->rollout.dtype;
  if (dtype == "auto") dtype = spec->device == DeviceKind::kCuda ? "bfloat16" : "float32";
  const Precision precision = dtype == "bfloat16" ? Precision::kBf16
                              : dtype == "float16" ? Precision::kFp16
                                                   : Precision::kFp32;
  if (deepspeed && deepspeed->is_object() && !deepspeed->empty() && spec->deepspeed.precision != Precision::kFp32 &&
      spec->deepspeed.precision != precision)
    return invalidArgument("rollout.dtype: {} disagrees with the deepspeed section's {}; a rollout's dtype is "
                           "rollout.dtype",
                           dtype, precisionName(spec->deepspeed.precision));
  spec->deepspeed.precision = precision;
  return Status::ok();
}

Status parseRestart(const json& object, JobSpec* spec) {
  ObjectReader r(object, "restart");
  int64_t maxRestarts = spec->maxRestarts;
  RETURN_IF_ERROR(r.readInt("max_restarts", &maxRestarts, false, 0, 1000));
  spec->maxRestarts = static_cast<int>(maxRestarts);
  RETURN_IF_ERROR(r.readBool("on_preemption", &spec->restartOnPreemption));
  return r.rejectUnknown();
}

Status parseTimeouts(const json& object, JobSpec* spec) {
  ObjectReader r(object, "timeouts");
  RETURN_IF_ERROR(r.readSeconds("grace_period_s", &spec->gracePeriodMs, 0, 3600));
  RETURN_IF_ERROR(r.readSeconds("heartbeat_timeout_s", &spec->heartbeatTimeoutMs, 0.5, 86400));
  RETURN_IF_ERROR(r.readSeconds("rendezvous_s", &spec->rendezvousTimeoutMs, 0.5, 86400));
  RETURN_IF_ERROR(r.readSeconds("collective_s", &spec->collectiveTimeoutMs, 0.5, 86400));
  return r.rejectUnknown();
}

}  // namespace

int64_t JobSpec::deviceMemoryBytes() const {
  return static_cast<int64_t>(deviceMemoryGb * static_cast<double>(int64_t(1) << 30));
}

Status checkRunnable(const JobSpec& spec) {
  const DeepSpeedConfig& ds = spec.deepspeed;
  constexpr const char* kPlanned = "is planned (loomctl plan) but not run by the workers yet";
  const ExpertParallelConfig& ep = ds.expertParallel;
  if (spec.kind == JobKind::kRollout) {
    // A rollout's ranks split the model (tensor parallelism); the rest is not built for generation.
    if (ds.sequenceParallelSize > 1)
      return invalidArgument("deepspeed.sequence_parallel_size: {}: a rollout runs without sequence parallelism",
                             ds.sequenceParallelSize);
    if (ep.enabled && ep.size > 1)
      return invalidArgument("deepspeed.expert_parallel.autoep_size: {}: a rollout with expert parallelism {}",
                             ep.size, kPlanned);
    if (spec.ranks != ds.tensorParallel.ranks())
      return invalidArgument("resources.ranks: {} ranks for a rollout whose model is split over {} "
                             "(tensor_parallel.autotp_size): a rollout's ranks are one tensor-parallel group; "
                             "data-parallel rollout engines {}",
                             spec.ranks, ds.tensorParallel.ranks(), kPlanned);
  }
  if (spec.kind == JobKind::kTrain && spec.data.format == DataFormat::kRollout && ds.sequenceParallelSize > 1)
    return invalidArgument("deepspeed.sequence_parallel_size: {}: training on rollout data (data.format rollout) "
                           "with sequence parallelism {}",
                           ds.sequenceParallelSize, kPlanned);
  if (ep.enabled && ep.size > 1 && ds.optimizer.type == OptimizerType::kMuon)
    return invalidArgument("deepspeed.expert_parallel.autoep_size: {} with the Muon optimizer {} (its experts' "
                           "matrices would need Newton-Schulz batched per expert)",
                           ep.size, kPlanned);
  return Status::ok();
}

namespace {

Status parseName(ObjectReader& r, JobSpec* spec) {
  RETURN_IF_ERROR(r.readString("name", &spec->name, /*required=*/true));
  if (spec->name.empty() || spec->name.size() > 63)
    return invalidArgument("name: must be 1 to 63 characters, got {}", spec->name.size());
  for (char c : spec->name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return invalidArgument("name: may hold letters, digits, '-', '_' and '.' only, got \"{}\"", spec->name);
  }
  return Status::ok();
}

// The deepspeed section: every key DeepSpeed's config may hold and every "auto" the job cannot
// fill go to `problems` one by one (a config pasted from a DeepSpeed job shows all it needs
// changed at once); the config itself is read only when they are none and the resources were
// read (the world size and the device decide what it may hold).
Status parseDeepSpeedSection(ObjectReader& r, bool resourcesRead, JobSpec* spec, std::vector<std::string>& problems) {
  if (const json* path = r.find("deepspeed"); path && path->is_string())
    return invalidArgument("deepspeed: \"{}\" is a file path, which loomctl reads and puts in its place; a spec sent "
                           "over the API carries the DeepSpeed config object itself",
                           path->get<std::string>());
  ASSIGN_OR_RETURN(const json* deepspeed, r.readObject("deepspeed"));
  ScreenedConfig screened = screenDeepSpeedKeys(deepspeed ? *deepspeed : json::object());
  auto resolved = resolveAutoValues(screened.config, AutoContext{.cuda = spec->device == DeviceKind::kCuda,
                                                                 .training = spec->kind == JobKind::kTrain,
                                                                 .trainSteps = spec->train.steps});
  problems.insert(problems.end(), screened.refusals.begin(), screened.refusals.end());
  if (!resolved.isOk()) return resolved.status();
  if (!screened.refusals.empty() || !resourcesRead) return Status::ok();
  ASSIGN_OR_RETURN(spec->deepspeed, parseDeepSpeedConfig(*resolved, spec->ranks, spec->kind == JobKind::kTrain));
  if (spec->kind == JobKind::kRollout) RETURN_IF_ERROR(resolveRolloutDtype(deepspeed, spec));
  return Status::ok();
}

}  // namespace

StatusOr<JobSpec> parseJobSpec(const std::string& specJson, SpecPurpose purpose) {
  json root;
  try {
    root = json::parse(specJson);
  } catch (const json::exception& e) {  // a parse error, or out_of_range: a number too large
    return invalidArgument("spec is not valid JSON: {}", e.what());
  }
  if (!root.is_object()) return invalidArgument("spec: must be a JSON object, got {}", root.type_name());

  JobSpec spec;
  ObjectReader r(root, "");
  // Every section is read even after another failed, and all their errors come back together
  // (the first of each section): a spec shows all it needs changed at once.
  std::vector<std::string> problems;
  auto note = [&](const Status& s) {
    if (!s.isOk()) problems.push_back(s.message());
    return s.isOk();
  };
  note(parseName(r, &spec));
  std::string kind;
  if (!note(r.readString("kind", &kind, true))) return specProblems(problems);
  const JobKindInfo* info = jobKindNamed(kind);
  if (!info) {
    problems.push_back(
        fmt::format("kind: \"{}\" is not a job kind this version runs (supported: {})", kind, jobKindNames()));
    return specProblems(problems);  // which sections apply depends on it
  }
  spec.kind = info->kind;

  // The world size and device decide what the deepspeed section may hold: without them it waits.
  bool resourcesRead = false;
  if (auto resources = r.readObject("resources"); !resources.isOk()) {
    note(resources.status());
  } else if (!*resources) {
    problems.push_back("resources: required field is missing");
  } else {
    resourcesRead = note(parseResources(**resources, &spec));
  }
  auto optionalSection = [&](const char* name, Status (*parse)(const json&, JobSpec*)) {
    auto object = r.readObject(name);
    if (!object.isOk()) return note(object.status());
    return !*object || note(parse(**object, &spec));
  };
  optionalSection("probe", parseProbe);
  optionalSection("restart", parseRestart);
  optionalSection("timeouts", parseTimeouts);
  // model, data and the kind's own section (train or eval); data before train, whose checks read it.
  // The kind's table row says which sections apply: model and data, and its own.
  auto own = [&](const char* section) { return std::string(info->section) == section; };
  using SectionParser = Status (*)(const json&, JobSpec*);
  const std::vector<std::tuple<const char*, SectionParser, bool, bool>> sections{
      // name, parser, applies, required
      {"model", parseModel, info->model, info->model},
      {"data", parseData, info->data, info->data},
      {"train", parseTrain, own("train"), own("train") && info->sectionRequired},
      {"eval", parseEval, own("eval"), own("eval") && info->sectionRequired},
      {"convert", parseConvert, own("convert"), own("convert") && info->sectionRequired},
      {"rollout", parseRollout, own("rollout"), own("rollout") && info->sectionRequired},
      {"kernels", parseKernels, true, false},  // a probe loads them with probe.kernels
  };
  bool dataRead = true;
  for (const auto& [section, parse, applies, required] : sections) {
    auto object = r.readObject(section);
    if (!object.isOk()) {
      note(object.status());
    } else if (!*object && required) {
      problems.push_back(fmt::format("{}: required for a {} job", section, kind));
    } else if (*object && !applies) {
      problems.push_back(fmt::format("{}: does not apply to a {} job", section, kind));
    } else if (*object && (std::string(section) != "train" || dataRead)) {
      const bool read = note(parse(**object, &spec));
      if (std::string(section) == "data") dataRead = read;
    }
  }
  note(parseDeepSpeedSection(r, resourcesRead, &spec, problems));
  note(r.rejectUnknown());
  RETURN_IF_ERROR(specProblems(problems));
  if (purpose == SpecPurpose::kRun) RETURN_IF_ERROR(checkRunnable(spec));
  return spec;
}

bool TrainSpec::freezes(const std::string& name) const {
  for (const std::string& pattern : frozenParameters)
    if (std::regex_match(name, std::regex(pattern))) return true;
  return false;
}

json JobSpec::toJson() const {
  json probeJson{{"ticks", probe.ticks}, {"tick_ms", probe.tickMs}, {"kernels", probe.kernels}};
  if (probe.collectives) {
    const auto& c = *probe.collectives;
    probeJson["collectives"] = {{"ops", c.ops},           {"min_bytes", c.minBytes}, {"max_bytes", c.maxBytes},
                                {"iterations", c.iterations}, {"warmup", c.warmup},      {"repeats", c.repeats},
                                {"dtype", c.dtype},           {"shared_memory", c.sharedMemory}};
  }
  json j{
      {"name", name},
      {"kind", jobKindName(kind)},
      {"resources", {{"ranks", ranks}, {"device", deviceKindName(device)}}},
      {"restart", {{"max_restarts", maxRestarts}, {"on_preemption", restartOnPreemption}}},
      {"timeouts",
       {{"grace_period_s", gracePeriodMs / 1000.0},
        {"heartbeat_timeout_s", heartbeatTimeoutMs / 1000.0},
        {"rendezvous_s", rendezvousTimeoutMs / 1000.0},
        {"collective_s", collectiveTimeoutMs / 1000.0}}},
      {"deepspeed", deepspeed.toJson()},
  };
  if (deviceMemoryGb > 0) j["resources"]["device_memory_gb"] = deviceMemoryGb;
  if (kind == JobKind::kProbe) j["probe"] = probeJson;
  if (jobKindInfo(kind).model) {
    j["model"] = {{"config", model.config}, {"init_seed", model.initSeed}};
    if (!model.weights.empty()) j["model"]["weights"] = model.weights;
    if (model.lossBlockRows > 0) j["model"]["loss_block_rows"] = model.lossBlockRows;
  }
  if (jobKindInfo(kind).data) {
    j["data"] = {{"seq_len", data.seqLen}, {"seed", data.seed}, {"pack_documents", data.packDocuments}};
    if (!data.train.empty()) j["data"]["train"] = data.train;
    if (!data.eval.empty()) j["data"]["eval"] = data.eval;
    if (data.format == DataFormat::kRollout) j["data"]["format"] = "rollout";
    if (!data.rewards.empty()) j["data"]["rewards"] = data.rewards;
    if (data.reward.kind != RewardRule::Kind::kNone) j["data"]["reward"] = rewardRuleToJson(data.reward);
  }
  if (!kernelPlugins.empty()) j["kernels"] = {{"plugins", kernelPlugins}};
  if (kind == JobKind::kTrain) {
    j["train"] = {{"steps", train.steps},
                  {"eval_every", train.evalEvery},
                  {"eval_batches", train.evalBatches},
                  {"checkpoint_every", train.checkpointEvery},
                  {"keep_checkpoints", train.keepCheckpoints},
                  {"resume", train.resume},
                  {"resume_optimizer", train.resumeOptimizer}};
    if (!train.checkpointDir.empty()) j["train"]["checkpoint_dir"] = train.checkpointDir;
    if (!train.frozenParameters.empty()) j["train"]["frozen_parameters"] = train.frozenParameters;
    if (train.profileStep > 0) j["train"]["profile_step"] = train.profileStep;
    if (train.gradientCheckpointing) j["train"]["gradient_checkpointing"] = true;
    if (train.loss.kind != LossSpec::Kind::kCrossEntropy) j["train"]["loss"] = lossSpecToJson(train.loss);
  }
  if (kind == JobKind::kConvert) {
    j["convert"] = {{"from", convert.from}, {"to", convert.to}, {"output", convert.output}};
    if (convert.to == "hf") {
      j["convert"]["shard_size"] = convert.shardBytes;
      j["convert"]["dtype"] = convert.dtype;
    }
    if (convert.to == "loom") {
      json layout{{"ranks", convert.layout.ranks}};
      if (convert.layout.zeroStage >= 0) layout["zero_stage"] = convert.layout.zeroStage;
      if (convert.layout.tensorParallel) layout["autotp_size"] = convert.layout.tensorParallel;
      if (convert.layout.sequenceParallel) layout["sequence_parallel_size"] = convert.layout.sequenceParallel;
      if (convert.layout.expertParallel) layout["autoep_size"] = convert.layout.expertParallel;
      if (convert.layout.paramPersistenceThreshold >= 0)
        layout["stage3_param_persistence_threshold"] = convert.layout.paramPersistenceThreshold;
      if (convert.layout.modelPersistenceThreshold >= 0)
        layout["stage3_model_persistence_threshold"] = convert.layout.modelPersistenceThreshold;
      j["convert"]["layout"] = layout;
      if (!convert.modelConfig.empty()) j["convert"]["config"] = convert.modelConfig;
    }
  }
  if (kind == JobKind::kRollout) j["rollout"] = rolloutSpecToJson(rollout);
  if (kind == JobKind::kEval) {
    j["eval"] = {{"max_batches", eval.maxBatches}};
    if (!eval.logprobsOutput.empty()) j["eval"]["logprobs_output"] = eval.logprobsOutput;
    if (eval.entropy) j["eval"]["entropy"] = true;
    if (!eval.klReference.empty()) j["eval"]["kl_reference"] = eval.klReference;
  }
  return j;
}

namespace {

// The keys of a spec that hold file paths: read by the ranks, or written.
const std::vector<std::vector<const char*>>& pathKeys() {
  static const std::vector<std::vector<const char*>> keys{
      {"model", "config"},    {"model", "weights"},     {"data", "train"},           {"data", "eval"},
      {"data", "rewards"},    {"train", "checkpoint_dir"}, {"train", "loss", "teacher"}, {"eval", "logprobs_output"},
      {"eval", "kl_reference"}, {"convert", "from"},     {"convert", "output"},       {"convert", "config"},
      {"rollout", "prompts"}, {"rollout", "output"},    {"rollout", "tokenizer"},
      // "deepspeed": "ds_config.json", which loomctl then reads in (DeepSpeed users keep it apart).
      {"deepspeed"},
      // DeepSpeed's monitors write under output_path,
      {"deepspeed", "tensorboard", "output_path"}, {"deepspeed", "csv_monitor", "output_path"},
      // wandb's runs under dir/wandb, and the flops profiler's report to its output_file.
      {"deepspeed", "wandb", "dir"}, {"deepspeed", "flops_profiler", "output_file"}};
  return keys;
}

// The value at a path of object keys, if every object on the way is there.
json* valueAt(json& root, const std::vector<const char*>& keys) {
  json* v = &root;
  for (const char* key : keys) {
    if (!v->is_object()) return nullptr;
    auto found = v->find(key);
    if (found == v->end()) return nullptr;
    v = &*found;
  }
  return v;
}

}  // namespace

std::vector<SpecPath> specPaths(const nlohmann::json& spec) {
  std::vector<SpecPath> out;
  json copy = spec;
  for (const auto& keys : pathKeys()) {
    json* v = valueAt(copy, keys);
    if (!v || !v->is_string()) continue;
    std::string field;
    for (const char* key : keys) field += (field.empty() ? "" : ".") + std::string(key);
    out.push_back({std::move(field), v->get<std::string>()});
  }
  return out;
}

std::string resolveSpecPaths(const std::string& specJson, const std::string& baseDir) {
  json root = json::parse(specJson, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object() || baseDir.empty()) return specJson;
  // A relative path string becomes one under baseDir; anything else stays as it is.
  auto resolve = [&](json& v) {
    if (!v.is_string()) return;
    const std::string p = v.get<std::string>();
    if (!p.empty() && p[0] != '/') v = (std::filesystem::path(baseDir) / p).lexically_normal().string();
  };
  for (const auto& keys : pathKeys()) {
    // The monitors' output_path: resolveMonitorPaths below, which also fills in the default.
    if (keys.size() == 3 && std::string(keys[0]) == "deepspeed") continue;
    if (json* v = valueAt(root, keys)) resolve(*v);
  }
  if (json* deepspeed = valueAt(root, {"deepspeed"})) resolveMonitorPaths(*deepspeed, baseDir);
  return root.dump(2);
}

// "deepspeed": "ds_config.json" (a DeepSpeed user's config file, kept as it is): the file's
// object in its place, so that what is submitted is whole. Errors name the file.
StatusOr<std::string> inlineDeepSpeedFile(const std::string& specText) {
  json root = json::parse(specText, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object() || !root.contains("deepspeed") || !root["deepspeed"].is_string()) return specText;
  const std::string path = root["deepspeed"].get<std::string>();
  auto text = files::readFile(path);
  if (!text.isOk()) return invalidArgument("deepspeed: {}", text.status().message());
  json config = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded())
    return invalidArgument("deepspeed: {} is not valid JSON (a DeepSpeed config file is a JSON object)", path);
  if (!config.is_object()) return invalidArgument("deepspeed: {} holds a JSON {}, not an object", path, config.type_name());
  // The monitors' output_path is relative to the config file, as the spec's paths are to the spec.
  resolveMonitorPaths(config, std::filesystem::absolute(path).parent_path().string());
  root["deepspeed"] = std::move(config);
  return root.dump(2);
}

StatusOr<std::string> resolveSpecFile(const std::string& specText, const std::string& baseDir) {
  return inlineDeepSpeedFile(resolveSpecPaths(specText, baseDir));
}

}  // namespace loom::planner
