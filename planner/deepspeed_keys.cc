#include "planner/deepspeed_keys.h"

#include <map>
#include <string>

#include <fmt/format.h>

#include "planner/deepspeed_config.h"

namespace loom::planner {

using json = nlohmann::json;

const std::vector<DeepSpeedKey>& deepSpeedKeys() {
  static const std::vector<DeepSpeedKey> kKeys{
      {"train_batch_size", KeyUse::kHonoured, "",
       ""},
      {"train_micro_batch_size_per_gpu", KeyUse::kHonoured, "",
       ""},
      {"gradient_accumulation_steps", KeyUse::kHonoured, "",
       ""},
      {"managed_gradient_accumulation", KeyUse::kDefaultOnly, "true",
       "Loom's step runs the accumulation itself; there is no user code to mark its boundaries"},
      {"steps_per_print", KeyUse::kHonoured, "",
       ""},
      {"dump_state", KeyUse::kIgnored, "",
       "DeepSpeed prints its config at start; Loom's normalized spec is `loomctl validate -o json`"},
      {"disable_python_gc", KeyUse::kIgnored, "",
       "Loom's ranks run no Python"},
      {"disable_allgather", KeyUse::kIgnored, "",
       "DeepSpeed 0.19.8 reads it and never uses it"},
      {"communication_data_type", KeyUse::kDefaultOnly, "null",
       "gradients are reduced in the dtype Loom's ZeRO engines keep them in"},
      {"seq_parallel_communication_data_type", KeyUse::kHonoured, "",
       ""},
      {"prescale_gradients", KeyUse::kDefaultOnly, "false",
       "gradients are averaged after the reduction, as at DeepSpeed's default"},
      {"gradient_predivide_factor", KeyUse::kDefaultOnly, "1.0",
       "gradients are averaged after the reduction, as at DeepSpeed's default"},
      {"gradient_allreduce_op", KeyUse::kDefaultOnly, "\"mean\"",
       "data-parallel gradients are averaged (DeepSpeed's default)"},
      {"gradient_clipping", KeyUse::kHonoured, "",
       ""},
      {"zero_optimization", KeyUse::kHonoured, "",
       ""},
      {"zero_allow_untested_optimizer", KeyUse::kIgnored, "",
       "the optimizer is always one Loom implements (`optimizer.type`): there is no client optimizer to allow"},
      {"zero_force_ds_cpu_optimizer", KeyUse::kIgnored, "",
       "with `offload_optimizer` Loom always steps its own CPU optimizer, as DeepSpeed's CPU Adam"},
      {"fp16", KeyUse::kHonoured, "",
       ""},
      {"bf16", KeyUse::kHonoured, "",
       ""},
      {"bfloat16", KeyUse::kHonoured, "",
       "DeepSpeed's older name of `bf16`"},
      {"torch_autocast", KeyUse::kDefaultOnly, "{}",
       "torch.autocast is not supported: use `bf16` or `fp16`"},
      {"activation_checkpointing", KeyUse::kHonoured, "",
       ""},
      {"optimizer", KeyUse::kHonoured, "",
       ""},
      {"scheduler", KeyUse::kHonoured, "",
       ""},
      {"wall_clock_breakdown", KeyUse::kHonoured, "",
       ""},
      {"memory_breakdown", KeyUse::kIgnored, "",
       "every job reports `memory.*` (parameters, gradients, optimizer state, peak RSS and device memory) at step 1 and every `steps_per_print` steps anyway"},
      {"flops_profiler", KeyUse::kHonoured, "",
       ""},
      {"autotuning", KeyUse::kDefaultOnly, "{}",
       "not supported: `loomctl plan` shows the plan and its memory estimate per rank"},
      {"comms_logger", KeyUse::kHonoured, "",
       ""},
      {"tensorboard", KeyUse::kHonoured, "",
       ""},
      {"wandb", KeyUse::kHonoured, "",
       ""},
      {"csv_monitor", KeyUse::kHonoured, "",
       ""},
      {"comet", KeyUse::kDefaultOnly, "{}",
       "not supported: use `tensorboard` or `csv_monitor` (the same events), the web page or /metrics"},
      {"use_data_before_expert_parallelism", KeyUse::kDefaultOnly, "false",
       "not supported: experts see the data of their expert-parallel group (DeepSpeed's default)"},
      {"hybrid_engine", KeyUse::kDefaultOnly, "{}",
       "not supported: generation runs as rollout jobs, whose weights a train job's checkpoints update (docs/rollout.md)"},
      {"pipeline", KeyUse::kDefaultOnly, "{}",
       "pipeline parallelism is not supported (DeepSpeed applies it to a PipelineModule only)"},
      {"data_efficiency", KeyUse::kDefaultOnly, "{}",
       "not supported: `data.*` decides the samples and their order"},
      {"checkpoint", KeyUse::kDefaultOnly, "{}",
       "not supported: `train.checkpoint_dir` and `train.keep_checkpoints` decide the checkpoints; convert jobs write universal ones"},
      {"data_types", KeyUse::kDefaultOnly, "{}",
       "not supported: gradients accumulate in the dtype Loom's ZeRO engines keep them in"},
      {"aio", KeyUse::kIgnored, "",
       "asynchronous I/O for NVMe offload, which Loom does not have (`device: nvme` is refused)"},
      {"dataloader_drop_last", KeyUse::kIgnored, "",
       "applies to DeepSpeed's own data loader; Loom's reader only ever forms whole batches"},
      {"log_level", KeyUse::kIgnored, "",
       "rank logs are Loom's own (`loomctl logs`)"},
      {"datastates_ckpt", KeyUse::kDefaultOnly, "null",
       "not supported: checkpoints are written by Loom (`train.checkpoint_dir`)"},
      {"weight_quantization", KeyUse::kDefaultOnly, "null",
       "not supported"},
      {"compile", KeyUse::kDefaultOnly, "{}",
       "not supported: ranks run C++ on libtorch with fused kernels (`kernels.plugins`), not torch.compile"},
      {"timers", KeyUse::kIgnored, "",
       "DeepSpeed's throughput timers; every step line carries tokens/s"},
      {"tensor_parallel", KeyUse::kHonoured, "",
       ""},
      {"expert_parallel", KeyUse::kHonoured, "",
       ""},
      {"sequence_parallel_size", KeyUse::kHonoured, "",
       ""},
      {"vocabulary_size", KeyUse::kIgnored, "",
       "DeepSpeed only warns with it; the vocabulary is the model's config.json's"},
      {"data_parallel_size", KeyUse::kDefaultOnly, "null",
       "the data-parallel size follows from `resources.ranks` and the parallel layout"},
      {"allgather_size", KeyUse::kIgnored, "",
       "read by DeepSpeed only with the legacy boolean form of `zero_optimization`"},
      {"nebula", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (Nebula checkpointing)"},
      {"compression_training", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (the compression library)"},
      {"amp", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (NVIDIA Apex AMP): use `bf16` or `fp16`"},
      {"quantize_training", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (Mixture-of-Quantization)"},
      {"sparse_gradients", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (sparse embedding gradients)"},
      {"eigenvalue", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (eigenvalue-based MoQ)"},
      {"sparse_attention", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (sparse attention)"},
      {"elasticity", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (elastic training): set the batch sizes directly"},
      {"graph_harvesting", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (graph harvesting)"},
      {"curriculum_learning", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (the legacy top-level form; its successor, `data_efficiency`, is not supported either)"},
      {"progressive_layer_drop", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (progressive layer dropping)"},
      {"zero_optimization.stage", KeyUse::kHonoured, "",
       ""},
      {"zero_optimization.contiguous_gradients", KeyUse::kNoEffect, "",
       "gradients always live in flat buffers"},
      {"zero_optimization.reduce_scatter", KeyUse::kNoEffect, "",
       "stages 1-3 always reduce-scatter gradients over flat buffers; the average is the same"},
      {"zero_optimization.reduce_bucket_size", KeyUse::kHonoured, "",
       "sizes stage 1/2's reduce-scatters"},
      {"zero_optimization.use_multi_rank_bucket_allreduce", KeyUse::kIgnored, "",
       "gradients are reduced as flat buffers, without per-rank buckets to combine"},
      {"zero_optimization.allgather_partitions", KeyUse::kNoEffect, "",
       "updated partitions are always all-gathered"},
      {"zero_optimization.allgather_bucket_size", KeyUse::kNoEffect, "",
       "updated partitions are all-gathered in one call per flat buffer"},
      {"zero_optimization.overlap_comm", KeyUse::kHonoured, "",
       ""},
      {"zero_optimization.compute_grad_norm", KeyUse::kDefaultOnly, "true",
       "the global gradient norm is always computed (clipping, the step line)"},
      {"zero_optimization.load_from_fp32_weights", KeyUse::kDefaultOnly, "true",
       "a resume takes the checkpoint's fp32 masters, as at DeepSpeed's default"},
      {"zero_optimization.elastic_checkpoint", KeyUse::kDefaultOnly, "false",
       "not supported: convert jobs reshard checkpoints (`convert.layout`)"},
      {"zero_optimization.offload_param", KeyUse::kHonoured, "",
       "stage 3 only"},
      {"zero_optimization.offload_optimizer", KeyUse::kHonoured, "",
       ""},
      {"zero_optimization.zenflow", KeyUse::kDefaultOnly, "null",
       "not supported"},
      {"zero_optimization.sub_group_size", KeyUse::kHonoured, "",
       "the host step's piece size with `offload_optimizer`"},
      {"zero_optimization.cpu_offload_param", KeyUse::kDefaultOnly, "null",
       "deprecated by DeepSpeed in favour of `offload_param`"},
      {"zero_optimization.cpu_offload_use_pin_memory", KeyUse::kDefaultOnly, "null",
       "deprecated by DeepSpeed in favour of `offload_optimizer.pin_memory`"},
      {"zero_optimization.cpu_offload", KeyUse::kDefaultOnly, "null",
       "deprecated by DeepSpeed in favour of `offload_optimizer`"},
      {"zero_optimization.stage3_prefetch_bucket_size", KeyUse::kHonoured, "",
       "0 turns stage 3's prefetch of the next block off; its size does not matter yet"},
      {"zero_optimization.stage3_param_persistence_threshold", KeyUse::kHonoured, "",
       ""},
      {"zero_optimization.stage3_model_persistence_threshold", KeyUse::kHonoured, "",
       ""},
      {"zero_optimization.stage3_max_live_parameters", KeyUse::kNoEffect, "",
       "at most two decoder blocks are ever gathered"},
      {"zero_optimization.stage3_max_reuse_distance", KeyUse::kNoEffect, "",
       "at most two decoder blocks are ever gathered"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", KeyUse::kNoEffect, "",
       "rank 0 always writes the whole model in a checkpoint"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", KeyUse::kIgnored, "",
       "DeepSpeed's older name of `stage3_gather_16bit_weights_on_model_save`: rank 0 always writes the whole model"},
      {"zero_optimization.stage3_module_granularity_threshold", KeyUse::kIgnored, "",
       "stage 3 gathers whole decoder blocks"},
      {"zero_optimization.stage3_use_all_reduce_for_fetch_params", KeyUse::kIgnored, "",
       "stage 3 gathers parameters with all-gathers; the values are the same"},
      {"zero_optimization.stage3_allgather_sequential", KeyUse::kIgnored, "",
       "stage 3 gathers a block's parameters together"},
      {"zero_optimization.ignore_unused_parameters", KeyUse::kIgnored, "",
       "every parameter of Loom's models takes part in each step"},
      {"zero_optimization.legacy_stage1", KeyUse::kDefaultOnly, "false",
       "DeepSpeed 0.19.8 does not support it either"},
      {"zero_optimization.round_robin_gradients", KeyUse::kIgnored, "",
       "a copy-scheduling choice of DeepSpeed's offload; the result is the same"},
      {"zero_optimization.parameter_alignment", KeyUse::kIgnored, "",
       "the flat buffers' layout is Loom's own"},
      {"zero_optimization.zero_hpz_partition_size", KeyUse::kDefaultOnly, "1",
       "ZeRO++ is not supported"},
      {"zero_optimization.zero_quantized_weights", KeyUse::kDefaultOnly, "false",
       "ZeRO++ is not supported"},
      {"zero_optimization.zero_quantized_nontrainable_weights", KeyUse::kDefaultOnly, "false",
       "ZeRO++ is not supported"},
      {"zero_optimization.zero_quantized_gradients", KeyUse::kDefaultOnly, "false",
       "ZeRO++ is not supported"},
      {"zero_optimization.memory_efficient_linear", KeyUse::kIgnored, "",
       "a setting of DeepSpeed's zero.Init for PyTorch modules"},
      {"zero_optimization.pipeline_loading_checkpoint", KeyUse::kIgnored, "",
       "a setting of DeepSpeed's zero.Init for PyTorch modules"},
      {"zero_optimization.override_module_apply", KeyUse::kIgnored, "",
       "a setting of DeepSpeed's zero.Init for PyTorch modules"},
      {"zero_optimization.log_trace_cache_warnings", KeyUse::kIgnored, "",
       "stage 3's schedule is fixed by the model's blocks: there is no trace cache"},
      {"zero_optimization.enable_sanity_checks", KeyUse::kIgnored, "",
       "a debugging aid of DeepSpeed's stage 3"},
      {"zero_optimization.save_muon_momentum_buffer_in_memory", KeyUse::kIgnored, "",
       "applies to NVMe offload, which Loom does not have"},
      {"zero_optimization.leaf_module", KeyUse::kIgnored, "",
       "a setting of DeepSpeed's zero.Init for PyTorch modules"},
      {"zero_optimization.mics_shard_size", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (MiCS)"},
      {"zero_optimization.mics_hierarchical_params_gather", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (MiCS)"},
      {"zero_optimization.zeropp_loco_param", KeyUse::kRemoved, "",
       "removed in DeepSpeed 0.19.8, which refuses it too (LoCo-ZeRO++)"},
      {"zero_optimization.offload_optimizer.device", KeyUse::kHonoured, "",
       "`none` or `cpu`; `nvme` is refused"},
      {"zero_optimization.offload_optimizer.pin_memory", KeyUse::kHonoured, "",
       ""},
      {"zero_optimization.offload_optimizer.ratio", KeyUse::kHonoured, "",
       "1.0 only"},
      {"zero_optimization.offload_optimizer.nvme_path", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"zero_optimization.offload_optimizer.buffer_count", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"zero_optimization.offload_optimizer.pipeline_read", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"zero_optimization.offload_optimizer.pipeline_write", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"zero_optimization.offload_optimizer.fast_init", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"zero_optimization.offload_optimizer.super_offload", KeyUse::kDefaultOnly, "false",
       "not supported"},
      {"zero_optimization.offload_optimizer.cpuadam_cores_perc", KeyUse::kIgnored, "",
       "for `super_offload`, which is refused"},
      {"zero_optimization.offload_param.device", KeyUse::kHonoured, "",
       "`none` or `cpu` (on CPU ranks the parameters are in host memory already); `nvme` is refused"},
      {"zero_optimization.offload_param.pin_memory", KeyUse::kHonoured, "",
       ""},
      {"zero_optimization.offload_param.nvme_path", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"zero_optimization.offload_param.buffer_count", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"zero_optimization.offload_param.buffer_size", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"zero_optimization.offload_param.max_in_cpu", KeyUse::kIgnored, "",
       "for `device: nvme`, which is refused"},
      {"fp16.enabled", KeyUse::kHonoured, "",
       ""},
      {"fp16.auto_cast", KeyUse::kIgnored, "",
       "the model's inputs are token ids, which no cast changes"},
      {"fp16.loss_scale", KeyUse::kHonoured, "",
       ""},
      {"fp16.initial_scale_power", KeyUse::kHonoured, "",
       ""},
      {"fp16.loss_scale_window", KeyUse::kHonoured, "",
       ""},
      {"fp16.hysteresis", KeyUse::kHonoured, "",
       ""},
      {"fp16.consecutive_hysteresis", KeyUse::kHonoured, "",
       ""},
      {"fp16.min_loss_scale", KeyUse::kHonoured, "",
       ""},
      {"fp16.fp16_master_weights_and_grads", KeyUse::kDefaultOnly, "false",
       "not supported: the masters are fp32"},
      {"bf16.enabled", KeyUse::kHonoured, "",
       ""},
      {"bf16.immediate_grad_update", KeyUse::kDefaultOnly, "false",
       "not supported"},
      {"bf16.check_grad_overflow", KeyUse::kDefaultOnly, "true",
       "not supported: a step whose gradient norm is not finite is skipped, as at DeepSpeed's default"},
      {"bf16.bf16_master_weights_and_grads", KeyUse::kDefaultOnly, "false",
       "not supported: the masters are fp32"},
      {"bf16.bf16_optimizer_states", KeyUse::kDefaultOnly, "false",
       "not supported: the optimizer state is fp32"},
      {"activation_checkpointing.partition_activations", KeyUse::kHonoured, "",
       "true is refused: each tensor-parallel rank keeps its checkpointed inputs whole"},
      {"activation_checkpointing.number_checkpoints", KeyUse::kHonoured, "",
       ""},
      {"activation_checkpointing.contiguous_memory_optimization", KeyUse::kNoEffect, "",
       "libtorch's caching allocator reuses the kept inputs' blocks already"},
      {"activation_checkpointing.cpu_checkpointing", KeyUse::kHonoured, "",
       ""},
      {"activation_checkpointing.profile", KeyUse::kHonoured, "",
       "true is refused: `train.profile_step` profiles a whole step"},
      {"activation_checkpointing.synchronize_checkpoint_boundary", KeyUse::kHonoured, "",
       "true is refused: `train.profile_step` shows where a step's time goes"},
  };
  return kKeys;
}

const char* keyUseName(KeyUse use) {
  switch (use) {
    case KeyUse::kHonoured: return "honoured";
    case KeyUse::kNoEffect: return "no effect";
    case KeyUse::kIgnored: return "ignored";
    case KeyUse::kDefaultOnly: return "default only";
    case KeyUse::kRemoved: return "removed";
  }
  return "?";
}

namespace {

// The sections whose keys the catalogue lists one by one; `bfloat16` is bf16's older name.
constexpr std::string_view kSections[] = {"zero_optimization", "zero_optimization.offload_optimizer",
                                          "zero_optimization.offload_param", "fp16", "bf16",
                                          "activation_checkpointing"};

bool isSection(std::string_view path) {
  for (std::string_view s : kSections)
    if (s == path) return true;
  return false;
}

// A value that asks for nothing: DeepSpeed's default, null, "auto" (DeepSpeed's sections take
// their default for it), false where the default is null, or a section that is empty, disabled
// or offloads to "none".
bool isInert(const json& value, std::string_view inert) {
  if (value.is_null() || (value.is_string() && value.get<std::string>() == "auto")) return true;
  const json expected = json::parse(inert, nullptr, false);
  if (value == expected) return true;
  if (value == false && expected.is_null()) return true;  // an old on/off flag, off
  if (value.is_number() && expected.is_number()) return value.get<double>() == expected.get<double>();
  if (value.is_object()) {
    if (value.empty()) return true;
    if (value.contains("enabled")) return value["enabled"] == false;
    if (value.contains("device")) return value.size() == 1 && value["device"] == "none";
  }
  return false;
}

// bf16's older name, bfloat16, shares its keys.
std::string canonical(const std::string& key) {
  if (key == "bfloat16" || key.rfind("bfloat16.", 0) == 0) return "bf16" + key.substr(8);
  return key;
}

// DeepSpeed reads its own sections with pydantic, which takes a field's default for "auto".
bool takesDefaultForAuto(const std::string& path, const std::string& field, const json& value) {
  if (!value.is_string() || value.get<std::string>() != "auto" || field == "enabled") return false;
  const std::string section = canonical(path);
  if (section == "zero_optimization")  // the HF Trainer's values sized from the model stay "auto"
    for (const char* sized : kModelSizedZeroKeys)
      if (field == sized) return false;
  return section == "zero_optimization" || section == "zero_optimization.offload_optimizer" ||
         section == "zero_optimization.offload_param" || section == "fp16" || section == "bf16";
}

// How a refused value is shown: itself, unless it is a long object.
std::string shown(const json& value) {
  std::string text = value.dump();
  if (value.is_object() && value.contains("enabled") && value["enabled"] == true) return "enabled";
  return text.size() <= 60 ? text : "this setting";
}

struct Screen {
  std::map<std::string_view, const DeepSpeedKey*> byPath;
  std::vector<std::string> refusals;

  // Whether the key at `key` (its JSON path under deepspeed) stays for the parser; refusals are recorded.
  bool keep(const std::string& path, const std::string& key, const json& value) {
    const std::string named = "deepspeed." + key;
    auto known = byPath.find(path.empty() ? key : canonical(key));
    if (known == byPath.end()) {
      refusals.push_back(fmt::format("{}: not a key of DeepSpeed 0.19.8's config", named));
      return true;
    }
    const DeepSpeedKey& k = *known->second;
    if (k.use == KeyUse::kRemoved) {
      refusals.push_back(fmt::format("{}: {}", named, k.reason));
      return true;
    }
    if (takesDefaultForAuto(path, key.substr(key.rfind('.') + 1), value)) return false;
    switch (k.use) {
      case KeyUse::kIgnored:
        return false;
      case KeyUse::kDefaultOnly:
        if (isInert(value, k.inert)) return false;
        refusals.push_back(fmt::format("{}: {} is not supported: {}", named, shown(value), k.reason));
        return true;
      default:
        return true;
    }
  }

  // Screens `object`, the section at `path` ("" for the top level), in place.
  void section(json& object, const std::string& path) {
    for (auto it = object.begin(); it != object.end();) {
      const std::string key = path.empty() ? it.key() : path + "." + it.key();
      if (!keep(path, key, it.value())) {
        it = object.erase(it);
        continue;
      }
      if (it.value().is_object() && isSection(canonical(key))) section(it.value(), key);
      ++it;
    }
  }
};

}  // namespace

ScreenedConfig screenDeepSpeedKeys(const json& deepspeed) {
  if (!deepspeed.is_object()) return {deepspeed, {}};  // the parser says what is wrong with it
  Screen screen;
  for (const DeepSpeedKey& k : deepSpeedKeys()) screen.byPath[k.path] = &k;
  json out = deepspeed;
  screen.section(out, "");
  return {std::move(out), std::move(screen.refusals)};
}

}  // namespace loom::planner
