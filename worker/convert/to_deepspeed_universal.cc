#include "worker/convert/to_deepspeed_universal.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "worker/convert/chunk_copy.h"
#include "worker/convert/torch_save_writer.h"
#include "worker/optim/lr_schedule.h"

namespace loom::worker {

using convert::SaveTensor;
using convert::SaveValue;
using nlohmann::json;

namespace {

constexpr int64_t kF32 = 4;
// The DeepSpeed whose loaders read these files (its optimizer_state.pt must name one).
constexpr const char* kDeepSpeedVersion = "0.19.8";
// Adam's state as DeepSpeed's universal files name it, and as Loom's checkpoints do.
constexpr std::pair<const char*, const char*> kAdamStates[] = {
    {"fp32", "master"}, {"exp_avg", "exp_avg"}, {"exp_avg_sq", "exp_avg_sq"}};

int64_t stateInt(const json& trainer, const char* key, int64_t otherwise) {
  return trainer.contains(key) && trainer[key].is_number_integer() ? trainer[key].get<int64_t>() : otherwise;
}

}  // namespace

UniversalWriter::UniversalWriter(const convert::ResumableCheckpoint& source) : source_(source) {}

Status UniversalWriter::prepare() {
  const json& trainer = source_.trainerState();
  // transformers 5 builds a MoE layer's experts as stacked tensors (experts.gate_up_proj,
  // experts.down_proj), and so does AutoEP (w1/w2/w3): the parameters DeepSpeed's universal
  // checkpoint is keyed by are not the per-expert HF names Loom trains and saves.
  if (source_.model().isMoe())
    return invalidArgument("convert.to: deepspeed_universal: {} is a mixture-of-experts model ({}), whose experts "
                           "DeepSpeed keeps as stacked tensors under other names than the per-expert ones of its HF "
                           "checkpoint: this version does not write them (to: hf and to: loom do)",
                           source_.tagDir(), planner::modelFamilyName(source_.model().family));
  if (!trainer.contains("deepspeed") || !trainer["deepspeed"].is_object())
    return invalidArgument("{}: its trainer state keeps no deepspeed config: what it trained with is unknown",
                           source_.tagDir());
  // The optimizer and schedule as the source ran them; its batch split does not matter here.
  json deepspeed = trainer["deepspeed"];
  deepspeed.erase("train_micro_batch_size_per_gpu");
  deepspeed.erase("gradient_accumulation_steps");
  const int64_t world = stateInt(trainer, "dp_world_size", 1) * stateInt(trainer, "tensor_parallel", 1) *
                        stateInt(trainer, "sequence_parallel", 1);
  auto config = planner::parseDeepSpeedConfig(deepspeed, world, /*training=*/true);
  if (!config.isOk()) return config.status().withContext(source_.tagDir() + ": trainer_state.json: deepspeed");
  config_ = *config;
  const planner::OptimizerType type = config_.optimizer.type;
  if (type != planner::OptimizerType::kAdam && type != planner::OptimizerType::kAdamW)
    return invalidArgument("convert.to: deepspeed_universal: {} trained with {}: this version writes the universal "
                           "checkpoints of Adam and AdamW runs (fp32, exp_avg, exp_avg_sq and one param group), "
                           "not yet those of other optimizers",
                           source_.tagDir(), planner::optimizerTypeName(type));
  if (config_.precision == planner::Precision::kFp16)
    return invalidArgument("convert.to: deepspeed_universal: {} is an fp16 checkpoint: its dynamic loss scale is not "
                           "carried over in this version (fp32 and bf16 are)",
                           source_.tagDir());

  for (const convert::SourceTensor& t : source_.tensors()) {
    if (t.role == convert::SourceTensor::Role::kBuffer) continue;
    const std::string folder = "zero/" + t.name + "/";
    const int64_t bytes = t.numel() * kF32;
    largest_ = std::max(largest_, bytes);
    ++parameters_;
    if (t.role == convert::SourceTensor::Role::kFrozen) {
      outputs_.push_back({.name = folder + "fp32.pt", .content = Content::kFrozenWeight, .tensor = &t, .bytes = bytes});
      continue;
    }
    for (const auto& [file, state] : kAdamStates) {
      if (!source_.state(t.name, state))
        return invalidArgument("{}: has no {} of parameter {}, which a universal checkpoint keeps as {}.pt",
                               source_.tagDir(), state, t.name, file);
      outputs_.push_back(
          {.name = folder + file + ".pt", .content = Content::kState, .tensor = &t, .state = state, .bytes = bytes});
    }
    outputs_.push_back({.name = folder + "step.pt", .content = Content::kStep, .tensor = &t});
  }
  outputs_.push_back({.name = "zero/optimizer_state.pt", .content = Content::kOptimizerState});
  outputs_.push_back({.name = "mp_rank_00_model_states.pt", .content = Content::kModelStates});
  outputs_.push_back({.name = "zero_pp_rank_0_mp_rank_00_model_states.pt", .content = Content::kModelStates});
  return Status::ok();
}

int64_t UniversalWriter::totalBytes() const {
  int64_t bytes = 0;
  for (const auto& o : outputs_) bytes += o.bytes;
  return bytes;
}

int64_t UniversalWriter::shareBytes(int rank, int ranks) const {
  int64_t bytes = 0;
  for (size_t i = rank; i < outputs_.size(); i += ranks) bytes += outputs_[i].bytes;
  return bytes;
}

std::string UniversalWriter::describe() const {
  return fmt::format("a DeepSpeed universal checkpoint of {} parameters at step {} ({}'s step count kept as {})",
                     parameters_, stateInt(source_.trainerState(), "step", 0),
                     config_.optimizer.torchAdam ? "torch.optim's Adam" : "DeepSpeed's Adam",
                     config_.optimizer.torchAdam ? "a float32 tensor (torch_adam)" : "an int");
}

Status UniversalWriter::writeShare(const std::string& dir, int rank, int ranks, ConvertProgress& progress) {
  const std::string tagDir = dir + "/" + source_.tag();
  for (size_t i = rank; i < outputs_.size(); i += ranks) RETURN_IF_ERROR(writeOutput(tagDir, outputs_[i], progress));
  return Status::ok();
}

Status UniversalWriter::writeOutput(const std::string& tagDir, const Output& out, ConvertProgress& progress) const {
  const std::string path = tagDir + "/" + out.name;
  RETURN_IF_ERROR(files::makeDirs(path.substr(0, path.rfind('/'))));
  RETURN_IF_ERROR(writeTensorFile(path, out).withContext("convert.output"));
  progress.tensorDone(out.bytes);
  return Status::ok();
}

Status UniversalWriter::writeTensorFile(const std::string& path, const Output& out) const {
  const json& trainer = source_.trainerState();
  const int64_t steps = source_.optimizerSteps();
  // The step count as the optimizer DeepSpeed builds keeps it: torch's Adam a float32 tensor,
  // DeepSpeed's own (FusedAdam, CPU Adam) an int.
  const bool stepTensor = config_.optimizer.torchAdam;
  const SaveValue step = stepTensor ? SaveValue::tensor(0) : SaveValue(steps);
  std::vector<SaveTensor> tensors;
  SaveValue root;
  std::vector<char> chunk;
  convert::SaveTensorBytes bytes = [&](size_t, const convert::ZipWriter::Sink& sink) -> Status {
    const float value = static_cast<float>(steps);
    return sink(&value, sizeof(value));
  };
  switch (out.content) {
    case Content::kState:
    case Content::kFrozenWeight: {
      tensors.push_back({"float32", out.tensor->shape});
      root = SaveValue::dict({{"param", SaveValue::tensor(0)}, {"cat_dim", 0}});
      if (out.content == Content::kState) {
        chunk.resize(static_cast<size_t>(convert::kStateChunkBytes));
        const std::vector<convert::SourceRange>& ranges = *source_.state(out.tensor->name, out.state);
        bytes = [&](size_t, const convert::ZipWriter::Sink& sink) -> Status {
          convert::ChunkBuffer buffer(chunk, sink);
          RETURN_IF_ERROR(convert::copyWhole(source_, ranges, convert::rangeStarts(ranges), 0, out.tensor->numel(),
                                             out.tensor->name + " " + out.state, buffer));
          return buffer.flush();
        };
      } else {
        bytes = [&](size_t, const convert::ZipWriter::Sink& sink) -> Status {
          return convert::copyTensorAs(source_, *out.tensor, "F32", convert::kStateChunkBytes, sink);
        };
      }
      break;
    }
    case Content::kStep:
      if (stepTensor) tensors.push_back({"float32", {}});
      root = step;
      break;
    case Content::kOptimizerState: {
      if (stepTensor) tensors.push_back({"float32", {}});
      const planner::OptimizerConfig& o = config_.optimizer;
      SaveValue::Items params;
      for (int64_t i = 0; i < parameters_; ++i) params.emplace_back(i);
      // The lr of the step DeepSpeed takes next: it reads the group's, and its scheduler moves
      // it only after that step.
      const SaveValue group = SaveValue::dict(
          {{"lr", train::learningRate(config_.scheduler, o.lr, steps)},
           {"betas", SaveValue::tuple({o.beta1, o.beta2})},
           {"eps", o.eps},
           {"weight_decay", o.weightDecay},
           {"params", SaveValue::list(std::move(params))}});
      root = SaveValue::dict(
          {{"optimizer_state_dict",
            SaveValue::dict({{"state", SaveValue::dict({{0, SaveValue::dict({{"step", step}})}})},
                             {"param_groups", SaveValue::list({group})}})},
           {"param_groups", SaveValue::list({group})},
           {"zero_stage", stateInt(trainer, "zero_stage", config_.zero.stage)},
           {"dynamic_loss_scale", false},
           {"overflow", false},
           {"clip_grad", config_.gradientClipping},
           {"ds_version", kDeepSpeedVersion}});
      break;
    }
    case Content::kModelStates:
      root = SaveValue::dict({{"module", SaveValue()},
                              {"buffer_names", SaveValue::list({})},
                              {"optimizer", SaveValue()},
                              // Its schedulers keep the iteration they last stepped to.
                              {"lr_scheduler", SaveValue::dict({{"last_batch_iteration", steps - 1}})},
                              {"data_sampler", SaveValue()},
                              {"random_ltd", SaveValue()},
                              {"global_steps", stateInt(trainer, "step", steps)},
                              {"global_samples", stateInt(trainer, "consumed_samples", 0)},
                              {"skipped_steps", stateInt(trainer, "skipped_steps", 0)},
                              {"dp_world_size", stateInt(trainer, "dp_world_size", 1)},
                              {"mp_world_size", 1},
                              {"ds_config", SaveValue::fromJson(trainer["deepspeed"])},
                              {"ds_version", kDeepSpeedVersion}});
      break;
  }
  return convert::writeTorchSave(path, root, tensors, bytes);
}

Status UniversalWriter::complete(const std::string& dir) const {
  return files::writeFileAtomic(dir + "/latest_universal", source_.tag());
}

}  // namespace loom::worker
