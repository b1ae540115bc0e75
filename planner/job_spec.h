#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/post_training_spec.h"
#include "planner/rollout_spec.h"

namespace loom::planner {

enum class JobKind { kProbe, kTrain, kEval, kConvert, kRollout };
enum class DeviceKind { kCpu, kCuda };

const char* jobKindName(JobKind kind);

// What the planner knows of a job kind, one row per kind (job_spec.cc): the one table that parsing,
// plan compilation and the worker's runners (worker/job_runners.cc) follow.
struct JobKindInfo {
  JobKind kind;
  const char* name;     // the spec's "kind"
  bool hasPlan;         // compiled into a Plan on submit, which its ranks execute
  bool model;           // its spec needs the model section
  bool data;            // and the data section
  const char* section;  // its own section of the spec ("probe", "train", "eval", "convert", "rollout")
  bool sectionRequired;
};
const JobKindInfo& jobKindInfo(JobKind kind);
const JobKindInfo* jobKindNamed(const std::string& name);  // null: not a kind
std::string jobKindNames();                                 // "probe, train, eval, convert, rollout"
const char* deviceKindName(DeviceKind device);

// The probe's collective benchmark (like nccl-tests): each op at sizes from minBytes to
// maxBytes, doubling, verified and timed.
struct CollectivesSpec {
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  int64_t minBytes = 8;
  int64_t maxBytes = 256 << 20;
  int iterations = 20;
  int warmup = 5;
  int repeats = 1;  // timed loops of `iterations`; the median loop's mean time counts
  std::string dtype = "float32";
  // The tensors come from the communicator's allocate(): on UCX, memory every rank of the host
  // maps, which collectives read and write in place. False: ordinary tensors.
  bool sharedMemory = true;
};

struct ProbeSpec {
  int ticks = 10;       // progress reports per rank before it exits 0
  int tickMs = 100;     // time between them
  std::optional<CollectivesSpec> collectives;
  // Each rank loads the kernel implementations a train job would get (the spec's
  // kernels.plugins, then LOOM_KERNEL_PATH's, then the libtorch reference) and prints them.
  bool kernels = false;
};

// model: an HF config.json, and optionally weights (a .safetensors file, or a directory with
// model.safetensors or model.safetensors.index.json); without weights, random init from a seed.
struct ModelSpec {
  std::string config;
  std::string weights;
  int64_t initSeed = 42;
  // Rows of logits per block of the losses (cross entropy, logprobs, entropy, KL), which never
  // hold more than one block in fp32; 0: as many rows as fit 2^24 logits.
  int64_t lossBlockRows = 0;
};

// data: token files (worker/data/token_file.h) cut into samples of seq_len + 1 tokens, or for
// training a rollout's results (format rollout, planner/post_training_spec.h), one sample per
// line, which seq_len + 1 tokens must hold.
struct DataSpec {
  std::string train;
  DataFormat format = DataFormat::kTokens;
  // Rollout data: a JSONL file of {"id", "sample", "reward"} (or "advantage", "advantages") lines
  // that a user's scorer wrote, laid over data.train's lines; and a rule that scores them instead.
  std::string rewards;
  RewardRule reward;
  std::string eval;
  int64_t seqLen = 0;
  int64_t seed = 1234;  // the sample order
  // Train on the token file's documents as they are packed in each sample: positions restart at
  // every document start and attention stays within a document (the last token of a document is
  // not trained to predict the next document's first).
  bool packDocuments = false;
};

// train: how long, how often to evaluate and to checkpoint.
struct TrainSpec {
  int64_t steps = 0;
  int64_t evalEvery = 0;     // 0: never
  int64_t evalBatches = 8;   // micro-batches per rank per evaluation
  int64_t checkpointEvery = 0;  // 0: only at the end
  std::string checkpointDir;    // empty: no checkpoints
  // Resume from checkpoint_dir/latest when there is one (a restarted job goes on by itself); a
  // damaged one falls back to the newest good one.
  bool resume = true;
  // train.resume_optimizer false (DeepSpeed's load_checkpoint(load_optimizer_states=False)): a
  // checkpoint another job wrote resumes with its weights, fp32 masters and step, and a fresh
  // optimizer state (moments, the optimizer's step count, the loss scale). The job's own
  // checkpoints (after a restart or a preemption) always resume whole.
  bool resumeOptimizer = true;
  // Complete checkpoints kept in checkpoint_dir; older ones are removed once a new one is
  // published.
  int64_t keepCheckpoints = 2;
  // Parameters held fixed: ECMAScript regular expressions, each matching whole HF names (the
  // regex model\.embed_tokens\.weight; model\.layers\.[0-3]\..* for the first four layers). A
  // frozen parameter gets no gradient and is not in the optimizer (no weight decay, no state).
  std::vector<std::string> frozenParameters;
  // A step (1-based) that rank 0 runs under libtorch's profiler, printing where its time went
  // (worker/torch/jobs/step_profiler.h). 0: none.
  int64_t profileStep = 0;
  // HF's gradient checkpointing: every decoder layer recomputed in backward, as the DeepSpeed
  // config's activation_checkpointing section does (which also tunes it).
  bool gradientCheckpointing = false;
  // The loss over each step's tokens (planner/post_training_spec.h).
  LossSpec loss;
  // Whether frozenParameters holds `name` (one of them matches it whole).
  bool freezes(const std::string& name) const;
};

// eval: mean loss over a dataset, and optionally the per-token logprobs as safetensors.
struct EvalSpec {
  int64_t maxBatches = 0;  // micro-batches per rank; 0: the whole dataset
  std::string logprobsOutput;
  bool entropy = false;     // the mean entropy of the predictions (eval_entropy), per token in the output
  // HF weights of a reference model of the same config: the mean KL(reference || model) of the
  // predictions (eval_kl), per token in the output.
  std::string klReference;
};

// convert: a checkpoint made into another format (worker/convert/, worker/torch/jobs/convert_job.h).
// convert.layout: the layout a `to: loom` conversion writes the checkpoint for, the resuming job's.
// Unset fields keep the source checkpoint's.
struct ConvertLayout {
  int ranks = 0;              // resources.ranks of the job that resumes
  int zeroStage = -1;         // zero_optimization.stage
  int tensorParallel = 0;     // tensor_parallel.autotp_size
  int sequenceParallel = 0;   // sequence_parallel_size
  int expertParallel = 0;     // expert_parallel.autoep_size (enabled where above 1)
  // zero_optimization.stage3_param_persistence_threshold and stage3_model_persistence_threshold:
  // which parameters stage 3 keeps whole, and so where its parts lie. -1: the checkpoint's.
  int64_t paramPersistenceThreshold = -1;
  int64_t modelPersistenceThreshold = -1;
};

struct ConvertSpec {
  // A DeepSpeed checkpoint directory (its `latest` names the tag) or one of its tag directories,
  // or a Loom training checkpoint directory (train.checkpoint_dir) or one of its tags.
  std::string from;
  // hf: Hugging Face safetensors (the fp32 masters where the checkpoint keeps them);
  // loom: a Loom checkpoint directory for `layout`, optimizer state included.
  std::string to = "hf";
  ConvertLayout layout;
  // config: the model's HF config.json, for a DeepSpeed checkpoint converted to loom (DeepSpeed
  // does not keep it; a Loom checkpoint does).
  std::string modelConfig;
  // Where the result goes: a directory that does not exist yet, or an empty one. It is written
  // beside it in a temporary directory and renamed into place when complete.
  std::string output;
  int64_t shardBytes = 5'000'000'000;  // shard_size: "5GB" as HF counts it
  std::string dtype = "keep";          // keep (as stored: fp32 masters), fp32, bf16
};

// A job spec as submitted (JSON), validated and with every default filled in. Field names in
// errors are the spec's own JSON paths ("resources.ranks") so a user can find them.
struct JobSpec {
  std::string name;
  JobKind kind = JobKind::kProbe;
  int ranks = 0;
  DeviceKind device = DeviceKind::kCpu;
  // resources.device_memory_gb: what one rank's device holds, in GiB (2^30 bytes); the plan's
  // memory estimate must fit in it. 80 for cuda unless given; 0 (no limit) for cpu.
  double deviceMemoryGb = 0;
  ProbeSpec probe;
  int maxRestarts = 0;
  // restart.on_preemption: a preempted attempt (its ranks got SIGTERM from outside Loom, or its
  // node was drained) is relaunched without counting against max_restarts; false counts it as a failure.
  bool restartOnPreemption = true;
  int64_t gracePeriodMs = 10'000;       // SIGTERM, then SIGKILL after this long: a train rank checkpoints in it
  int64_t heartbeatTimeoutMs = 30'000;  // a rank silent for this long fails the attempt
  int64_t rendezvousTimeoutMs = 300'000;  // every rank must have joined the attempt's store by then
  int64_t collectiveTimeoutMs = 1'800'000;  // the watchdog: a collective not done by then fails the attempt
  ModelSpec model;     // train, eval, rollout
  DataSpec data;       // train, eval
  TrainSpec train;     // train
  EvalSpec eval;       // eval
  ConvertSpec convert; // convert
  RolloutSpec rollout; // rollout
  DeepSpeedConfig deepspeed;
  // kernels.plugins: kernel plugin files or directories (kernels/loader.h), loaded by every rank
  // before LOOM_KERNEL_PATH's.
  std::vector<std::string> kernelPlugins;

  // The spec with defaults filled in: what is stored and handed to the ranks.
  nlohmann::json toJson() const;
  // resources.device_memory_gb in bytes; 0: no limit.
  int64_t deviceMemoryBytes() const;
};

inline constexpr double kDefaultCudaMemoryGb = 80;

// What a spec is parsed for. kRun (submit, validate, run, the workers) refuses what the planner
// lays out but the workers do not run yet: tensor, sequence and expert parallelism. kPlan
// (`loomctl plan`) accepts it.
enum class SpecPurpose { kRun, kPlan };

// Parses and validates a spec. Unknown keys are errors, never ignored.
StatusOr<JobSpec> parseJobSpec(const std::string& specJson, SpecPurpose purpose = SpecPurpose::kRun);

// OK when the workers run every setting of the spec; else InvalidArgument naming the first
// setting that is only planned ("deepspeed.sequence_parallel_size: 2: sequence parallelism
// is planned (loomctl plan) but not run by the workers yet"). parseJobSpec(kRun) applies it.
Status checkRunnable(const JobSpec& spec);

// A file path a spec names: its field ("model.weights") and value as written.
struct SpecPath {
  std::string field;
  std::string path;
};
// Every file path of a spec (model, data, checkpoints, outputs, the DeepSpeed config file and its
// monitors' output_path): what the ranks read or write, and what a tenant's roots confine.
std::vector<SpecPath> specPaths(const nlohmann::json& spec);

// Makes the file paths of a spec (model, data, checkpoint and output paths) absolute against
// `baseDir`, the directory of the spec file: the ranks run elsewhere, in another directory.
// Leaves the text alone when it is not a JSON object (parseJobSpec reports that).
std::string resolveSpecPaths(const std::string& specJson, const std::string& baseDir);

// "deepspeed": "ds_config.json" (a DeepSpeed user's config file, kept as it is): the file's
// object in its place, its monitors' output_path made absolute against the file's directory, so
// that what is submitted is whole. Errors name the file. Other text is returned as it is.
StatusOr<std::string> inlineDeepSpeedFile(const std::string& specText);

// A spec file's text as it is submitted: resolveSpecPaths against `baseDir`, then
// inlineDeepSpeedFile. What loomctl does with a spec file, and what the planner does with a
// CreateJob or ValidateJob request that names its base_dir (the Python client's submit(path)).
StatusOr<std::string> resolveSpecFile(const std::string& specText, const std::string& baseDir);

}  // namespace loom::planner
