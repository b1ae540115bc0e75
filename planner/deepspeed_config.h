#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/tensor_parallel.h"

namespace loom::planner {

// A job's `deepspeed` object: a DeepSpeed config, read with DeepSpeed's key names, meanings and
// defaults (shared/reference/deepspeed-semantics.md). A key this version does not act on is
// refused by name, never ignored.

// DeepSpeed's comms_logger section, same keys and defaults.
struct CommsLoggerSpec {
  bool enabled = false;
  bool verbose = false;
  bool profAll = true;
  std::vector<std::string> profOps;
};

// DeepSpeed's tensorboard and csv_monitor sections (its monitor/config.py), same keys and
// defaults: rank 0 writes DeepSpeed's events into output_path/job_name.
struct MonitorConfig {
  bool enabled = false;
  std::string outputPath;  // relative: to the spec file's (or the ds_config file's) directory
  std::string jobName = "DeepSpeedJobName";

  // output_path/job_name, as DeepSpeed joins them.
  std::string directory() const;
};

// DeepSpeed's wandb section (its monitor/config.py WandbConfig): rank 0 writes the run as wandb
// does in offline mode, under dir/wandb/, for `wandb sync` to upload.
struct WandbConfig {
  bool enabled = false;
  std::string group;
  std::string team;  // wandb's entity
  std::string project = "deepspeed";
  // Loom's: where wandb's `wandb/` directory goes (DeepSpeed's wandb takes WANDB_DIR or the launch
  // directory); relative: to the spec file's (or the ds_config file's) directory, its default.
  std::string dir;
};

// DeepSpeed's flops_profiler section (its profiling/config.py): rank 0 profiles the forward of
// the last micro-batch of step `profileStep` (DeepSpeed's global_steps, from 0) and prints the
// report after that step, to its log or to `outputFile`.
struct FlopsProfilerConfig {
  bool enabled = false;
  double recomputeFwdFactor = 0;  // recompute_fwd_factor: the backward's extra forwards (checkpointing)
  int64_t profileStep = 1;
  int64_t moduleDepth = -1;  // -1: every depth but the innermost
  int64_t topModules = 1;
  bool detailed = true;
  std::string outputFile;  // empty: the log; relative: to the spec file's (or ds_config's) directory
};

enum class OptimizerType { kAdamW, kAdam, kLion, kAdagrad, kMuon };
const char* optimizerTypeName(OptimizerType type);

// Muon's Newton-Schulz iteration: DeepSpeed's Gram form (iterates on the small square Gram
// matrix, fp16) or the standard quintic one (bf16).
enum class NsMethod { kGram, kStandard };
const char* nsMethodName(NsMethod method);

// The Muon half of DeepSpeed's MuonWithAuxAdam: the matrices (optimizer_rules.h says which).
struct MuonConfig {
  double lr = 0.02;          // muon_lr, else lr, else 0.02
  double momentum = 0.95;    // Nesterov momentum
  double weightDecay = 0.0;  // decoupled: p -= lr * weight_decay * p
  NsMethod nsMethod = NsMethod::kGram;
  bool perHead = false;      // per_head_muon: q/k/v projections orthogonalized head by head
};

// optimizer {type, params}. Defaults are those of DeepSpeed's own optimizers (FusedAdam,
// FusedLion, DeepSpeedCPUAdagrad), not torch's. For Muon the fields below are its auxiliary
// Adam's (the parameters that are not matrices, the embedding and the head), with
// MuonWithAuxAdam's defaults (lr 3e-4, betas (0.9, 0.95), eps 1e-10), and `muon` the rest.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;   // Lion: 0.99
  double eps = 1e-8;      // Adagrad: 1e-10
  double weightDecay = 0.0;
  bool biasCorrection = true;
  // DeepSpeed's "Adam" is decoupled (AdamW) unless adam_w_mode is false; then weight decay is an
  // L2 term added to the gradient.
  bool decoupledWeightDecay = true;
  // torch_adam: DeepSpeed runs torch.optim's Adam/AdamW instead of its own FusedAdam or CPU Adam.
  // The update is the same; what differs is how its state keeps the step count (a tensor in
  // torch's, an int in DeepSpeed's), which a checkpoint written for DeepSpeed must match.
  bool torchAdam = false;
  MuonConfig muon;  // type kMuon only

  // The elementwise optimizer of the parameters Muon does not take: this one, or Muon's AdamW.
  OptimizerConfig auxiliary() const;
};

enum class SchedulerType { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
const char* schedulerTypeName(SchedulerType type);

struct SchedulerConfig {
  SchedulerType type = SchedulerType::kConstant;
  double warmupMinLr = 0.0;
  // warmup_max_lr; unset: each optimizer half's own lr, as DeepSpeed takes its param groups'.
  std::optional<double> warmupMaxLr;
  int64_t warmupNumSteps = 1000;
  bool warmupLinear = false;  // warmup_type "linear"; DeepSpeed's default is "log"
  int64_t totalNumSteps = 0;  // WarmupDecayLR, WarmupCosineLR
  double warmupMinRatio = 0.0;    // WarmupCosineLR
  double cosMinRatio = 1e-4;      // WarmupCosineLR
};

enum class Precision { kFp32, kBf16, kFp16 };
const char* precisionName(Precision precision);

// fp16's dynamic loss scaler (loss_scale 0) or a static scale.
struct LossScaleConfig {
  double staticScale = 0.0;  // loss_scale; 0 = dynamic
  int initialScalePower = 16;
  int64_t window = 1000;     // loss_scale_window
  int hysteresis = 2;
  bool consecutiveHysteresis = false;
  double minScale = 1.0;     // min_loss_scale
};

// The HF Trainer integration sizes three of zero_optimization's values from the model's
// hidden_size when the config says "auto": reduce_bucket_size hidden_size²,
// stage3_prefetch_bucket_size 0.9 hidden_size², stage3_param_persistence_threshold 10 hidden_size.
// A job learns hidden_size when its plan is compiled; until then the value is kSizedFromModel.
inline constexpr int64_t kSizedFromModel = -1;
inline constexpr const char* kModelSizedZeroKeys[] = {"reduce_bucket_size", "stage3_prefetch_bucket_size",
                                                      "stage3_param_persistence_threshold"};

// zero_optimization, with DeepSpeed's keys and defaults. The bucket and prefetch sizes tune
// communication only; they never change the result.
struct ZeroConfig {
  int stage = 0;
  bool contiguousGradients = true;
  bool reduceScatter = true;
  int64_t reduceBucketSize = 500'000'000;     // elements, or kSizedFromModel
  bool allgatherPartitions = true;
  int64_t allgatherBucketSize = 500'000'000;  // elements
  bool overlapComm = false;                   // DeepSpeed: true for stage 3
  int64_t prefetchBucketSize = 50'000'000;    // stage3_prefetch_bucket_size, or kSizedFromModel
  int64_t paramPersistenceThreshold = 100'000;  // stage3_param_persistence_threshold, or kSizedFromModel
  int64_t modelPersistenceThreshold = INT64_MAX;  // stage3_model_persistence_threshold
  int64_t maxLiveParameters = 1'000'000'000;    // stage3_max_live_parameters
  int64_t maxReuseDistance = 1'000'000'000;     // stage3_max_reuse_distance
  bool gather16BitWeightsOnModelSave = false;   // stage3_gather_16bit_weights_on_model_save
  int64_t subGroupSize = 1'000'000'000;
  // offload_optimizer.device: "none" or "cpu" (optimizer state and step on the host).
  std::string offloadOptimizer = "none";
  bool offloadPinMemory = true;
  double offloadRatio = 1.0;
  // offload_param.device: "none" or "cpu" (stage 3: each rank's part of every partitioned
  // parameter in host memory, copied to the device block by block as it is gathered).
  std::string offloadParam = "none";
  bool offloadParamPinMemory = true;

  // This config with its kSizedFromModel values filled from the model's hidden_size.
  ZeroConfig sizedFor(int64_t hiddenSize) const;
};

// expert_parallel (DeepSpeed's AutoEP), with its keys and defaults. A field left "auto" (or null)
// takes the model config's value when the plan is compiled (parallel_checks.h: resolveRouting).
struct ExpertParallelConfig {
  bool enabled = false;
  int size = 1;                        // autoep_size: ranks the experts are split over
  std::string presetModel;             // preset_model; empty: the model's own model_type
  bool useGroupedMm = true;
  std::optional<bool> routeNorm;       // route_norm; null: the model's norm_topk_prob
  double routeScale = 1.0;             // route_scale: multiplies the routing weights
  std::string scoreFunc = "auto";      // score_func: auto, softmax or sigmoid
  int64_t topK = 0;                    // top_k; 0: "auto", the model's num_experts_per_tok
  int64_t numExpertGroups = 0;         // num_expert_groups; 0: null, the model's n_group
  int64_t numLimitedGroups = 0;        // num_limited_groups; 0: null, the model's topk_group
  std::optional<double> routedScalingFactor;  // routed_scaling_factor; null: "auto", the model's
  std::optional<bool> hasSharedExperts;       // has_shared_experts; null: whether the model has them
  std::string gateUpImpl = "separate";        // gate_up_impl: separate or fused
  std::string expertActivation;               // expert_activation; empty: null, the preset's (swiglu)
  // The expert-parallel size in effect: autoep_size when enabled, else 1.
  int ranks() const { return enabled ? size : 1; }
};

// activation_checkpointing: DeepSpeed's keys. Loom owns the model, so the section itself turns
// checkpointing on: every decoder layer (or the first number_checkpoints) keeps only its input
// and is recomputed in backward.
struct ActivationCheckpointingConfig {
  bool enabled = false;        // the section is present (or train.gradient_checkpointing)
  bool cpuCheckpointing = false;
  int64_t numberCheckpoints = 0;  // 0: null, every decoder layer
  bool contiguousMemoryOptimization = false;
};

struct DeepSpeedConfig {
  // The batch-size triple, resolved against the data-parallel size (train = micro * gas * dp).
  int64_t trainBatchSize = 0;
  int64_t microBatchSize = 0;
  int64_t gradientAccumulationSteps = 1;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Precision precision = Precision::kFp32;
  // bf16.check_grad_overflow: under bf16 at ZeRO 1-2, a step whose gradient norm is not finite is
  // skipped (skipsNonFiniteSteps).
  bool bf16CheckGradOverflow = true;
  LossScaleConfig lossScale;
  double gradientClipping = 1.0;  // 0 disables
  int64_t stepsPerPrint = 10;
  bool wallClockBreakdown = false;  // rank 0 prints DeepSpeed's timer lines every step
  ZeroConfig zero;
  CommsLoggerSpec commsLogger;
  MonitorConfig tensorboard;
  MonitorConfig csvMonitor;
  WandbConfig wandb;
  FlopsProfilerConfig flopsProfiler;
  ActivationCheckpointingConfig activationCheckpointing;
  // The parallel layout: world = dp x sp x tp, experts split over ep ranks of dp x sp.
  TensorParallelConfig tensorParallel;  // tensor_parallel
  ExpertParallelConfig expertParallel;  // expert_parallel
  int sequenceParallelSize = 1;         // sequence_parallel_size (Ulysses)
  // seq_parallel_communication_data_type: the dtype gradients are reduced in when sp > 1
  // (DeepSpeed's default fp32).
  Precision sequenceCommunicationType = Precision::kFp32;
  int dataParallelSize = 1;             // world / (tp x sp): the batch triple's data-parallel ranks

  nlohmann::json toJson() const;
  // Whether a step whose gradient norm is not finite is skipped, as DeepSpeed 0.19.8 does: always
  // under fp16 (the loss scale drops); under bf16 at stage 0 (its BF16_Optimizer) and, with
  // bf16.check_grad_overflow, at stages 1-2; never at stage 3 or in fp32.
  bool skipsNonFiniteSteps() const;
};

// Parses the `deepspeed` object of a job of `world` ranks. The data-parallel size of the batch
// triple is world / (tp x sp) (the mesh's, planner/mesh.h). `training` says whether the batch
// triple is required (train jobs) or optional (eval and probe jobs).
StatusOr<DeepSpeedConfig> parseDeepSpeedConfig(const nlohmann::json& object, int64_t world, bool training);

// The monitors' output_path (tensorboard, csv_monitor) and wandb's dir of a `deepspeed` object
// made absolute under `baseDir`, "" included (DeepSpeed's default, its launch directory, becomes
// baseDir).
void resolveMonitorPaths(nlohmann::json& deepspeed, const std::string& baseDir);

}  // namespace loom::planner
