#include "worker/convert/loom_checkpoint.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"
#include "planner/optimizer_rules.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/shard_layout.h"
#include "worker/convert/dtype_cast.h"

namespace loom::convert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kF32 = 4;

bool trains(const planner::ParameterSpec& p) { return p.trainable && !p.frozen; }

// A run of a parameter's state in one file: elements [whole, whole + length) of the whole
// parameter, at byte `offset` of file `file`.
struct StoredRun {
  int64_t whole = 0, length = 0;
  int file = 0;
  int64_t offset = 0;
};

}  // namespace

StatusOr<int> LoomCheckpoint::openFile(const std::string& name) {
  if (auto it = fileIndex_.find(name); it != fileIndex_.end()) return it->second;
  ASSIGN_OR_RETURN(auto file, checkpoint::SafetensorsFile::open(tagDir_ + "/" + name));
  files_.push_back(std::move(file));
  fileIndex_[name] = static_cast<int>(files_.size()) - 1;
  return static_cast<int>(files_.size()) - 1;
}

StatusOr<std::unique_ptr<LoomCheckpoint>> LoomCheckpoint::open(const std::string& dir) {
  std::unique_ptr<LoomCheckpoint> ckpt(new LoomCheckpoint());
  if (files::exists(dir + "/latest")) {
    ASSIGN_OR_RETURN(ckpt->tag_, checkpoint::readLatestTag(dir));
    if (ckpt->tag_.empty() || ckpt->tag_.find('/') != std::string::npos)
      return invalidArgument("{}/latest: \"{}\" is not a tag", dir, ckpt->tag_);
    ckpt->tagDir_ = dir + "/" + ckpt->tag_;
  } else {
    ckpt->tagDir_ = dir;
    ckpt->tag_ = fs::path(dir).lexically_normal().filename().string();
  }
  const std::string& tagDir = ckpt->tagDir_;
  RETURN_IF_ERROR(checkpoint::checkManifest(tagDir));
  ASSIGN_OR_RETURN(std::string trainerText, files::readFile(tagDir + "/trainer_state.json"));
  ckpt->trainer_ = json::parse(trainerText, nullptr, false);
  const json& t = ckpt->trainer_;
  const std::string trainerFile = tagDir + "/trainer_state.json";
  for (const char* key : {"step", "applied_steps", "skipped_steps", "train_batch_size", "dp_world_size",
                          "zero_stage", "loss_scaler", "deepspeed"}) {
    if (!t.is_object() || !t.contains(key)) return invalidArgument("{}: has no {}", trainerFile, key);
  }
  ASSIGN_OR_RETURN(ckpt->configText_, files::readFile(tagDir + "/config.json"));
  ASSIGN_OR_RETURN(ckpt->model_, planner::parseModelConfig(ckpt->configText_, tagDir + "/config.json"));
  ckpt->frozen_ = t.value("frozen_parameters", std::vector<std::string>{});
  const int world = t.at("dp_world_size").get<int>() * t.value("tensor_parallel", 1);
  ASSIGN_OR_RETURN(ckpt->layout_,
                   compileLayout(ckpt->model_, t.at("deepspeed"), world, ckpt->frozen_, trainerFile + ": deepspeed"));
  if (ckpt->layout_.deepspeed.zero.stage != t.at("zero_stage").get<int>())
    return invalidArgument("{}: zero_stage {} is not its deepspeed config's stage {}", trainerFile,
                           t.at("zero_stage").get<int>(), ckpt->layout_.deepspeed.zero.stage);
  ASSIGN_OR_RETURN(ckpt->stateLayout_, checkpoint::stateLayout(ckpt->layout_.plan, ckpt->layout_.deepspeed));

  ASSIGN_OR_RETURN(std::vector<std::string> models, checkpoint::modelFiles(tagDir));
  for (const std::string& path : models) {
    const std::string name = fs::path(path).filename().string();
    ckpt->modelFiles_.push_back(name);
    RETURN_IF_ERROR(ckpt->openFile(name).status());
  }
  if (files::exists(tagDir + "/model.safetensors.index.json")) ckpt->modelFiles_.push_back("model.safetensors.index.json");
  for (int r = 0; r < world; ++r) {
    if (files::exists(tagDir + "/" + checkpoint::rankFileName(r)))
      RETURN_IF_ERROR(ckpt->openFile(checkpoint::rankFileName(r)).status());
  }
  RETURN_IF_ERROR(ckpt->mapState());

  // The model as HF holds it: each tensor of the model files, from the masters where it trains.
  std::map<std::string, int> parameterOf;
  const auto& parameters = ckpt->layout_.plan.parameters;
  for (size_t i = 0; i < parameters.size(); ++i) parameterOf[parameters[i].name] = static_cast<int>(i);
  for (const std::string& name : ckpt->modelFiles_) {
    auto k = ckpt->fileIndex_.find(name);
    if (k == ckpt->fileIndex_.end()) continue;  // the index
    for (const checkpoint::StoredTensor& stored : ckpt->files_[k->second]->tensors()) {
      const checkpoint::SafetensorsEntry& e = stored.entry;
      auto p = parameterOf.find(e.name);
      const std::vector<SourceRange>* master = ckpt->state(e.name, "master");
      if (master) {
        ckpt->tensors_.push_back({.name = e.name, .dtype = "float32", .elementBytes = kF32, .shape = e.shape,
                                  .ranges = *master, .role = SourceTensor::Role::kTrainable});
        continue;
      }
      const StoredDtype* dtype = storedDtypeOfSafetensors(e.dtype);
      if (!dtype) return invalidArgument("{}: tensor {} is {}", ckpt->files_[k->second]->path(), e.name, e.dtype);
      const bool frozen = p != parameterOf.end() && parameters[p->second].frozen;
      ckpt->tensors_.push_back(
          {.name = e.name, .dtype = dtype->stored, .elementBytes = checkpoint::safetensorsElementBytes(e.dtype),
           .shape = e.shape, .ranges = {{.file = k->second, .offset = stored.offset, .bytes = e.bytes()}},
           .role = frozen ? SourceTensor::Role::kFrozen : SourceTensor::Role::kBuffer});
    }
  }
  return ckpt;
}

Status LoomCheckpoint::mapState() {
  const planner::Plan& plan = layout_.plan;
  std::map<std::pair<int, std::string>, std::vector<StoredRun>> runs;
  bool haveStep = false;
  for (const checkpoint::StateFile& f : stateLayout_.files) {
    ASSIGN_OR_RETURN(int k, openFile(f.file));
    const checkpoint::SafetensorsFile& file = *files_[k];
    if (!haveStep) {
      const checkpoint::StoredTensor* step = file.find("step");
      if (!step || step->entry.dtype != "I64" || step->numel() != 1)
        return invalidArgument("{}: has no step (int64 [1])", file.path());
      RETURN_IF_ERROR(file.read(step->offset, 8, &steps_));
      haveStep = true;
    }
    for (const checkpoint::StateTensor& t : f.tensors) {
      const checkpoint::StoredTensor* stored = file.find(t.name);
      if (!stored)
        return invalidArgument("{}: has no {}, which its layout (ZeRO stage {}, {} ranks) keeps there", file.path(),
                               t.name, layout_.deepspeed.zero.stage, layout_.ranks);
      if (stored->entry.dtype != "F32" || stored->numel() != t.numel())
        return invalidArgument("{}: {} is {} of {} elements; its layout keeps F32 of {}", file.path(), t.name,
                               stored->entry.dtype, stored->numel(), t.numel());
      for (const checkpoint::StatePiece& piece : t.pieces) {
        const auto shard = checkpoint::shardLayout(plan.parameters[piece.parameter], f.tpRank, plan.mesh.tp);
        for (const checkpoint::ElementRun& run : checkpoint::wholeRuns(shard, piece.offset, piece.length))
          runs[{piece.parameter, t.state}].push_back(
              {.whole = run.whole, .length = run.length, .file = k,
               .offset = stored->offset + (piece.at + run.piece - piece.offset) * kF32});
      }
    }
  }
  if (stateLayout_.mastersAreWeights) {
    // Stage 0 in fp32: the optimizer updated the weights themselves.
    for (size_t i = 0; i < plan.parameters.size(); ++i) {
      const planner::ParameterSpec& p = plan.parameters[i];
      if (!trains(p)) continue;
      for (const std::string& name : modelFiles_) {
        auto k = fileIndex_.find(name);
        if (k == fileIndex_.end()) continue;
        const checkpoint::StoredTensor* stored = files_[k->second]->find(p.name);
        if (!stored) continue;
        if (stored->entry.dtype != "F32" || stored->numel() != p.numel())
          return invalidArgument("{}: {} is {} of {} elements; an fp32 stage 0 checkpoint keeps F32 of {}",
                                 files_[k->second]->path(), p.name, stored->entry.dtype, stored->numel(), p.numel());
        runs[{static_cast<int>(i), "master"}].push_back(
            {.whole = 0, .length = p.numel(), .file = k->second, .offset = stored->offset});
      }
    }
  }
  // Each parameter's runs in order, every element once: pieces held by several ranks (replicated
  // under tensor parallelism, or by every data-parallel replica) are read from the first.
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const planner::ParameterSpec& p = plan.parameters[i];
    if (!trains(p)) continue;
    std::vector<std::string> names{"master"};
    for (const std::string& s : planner::optimizerRule(layout_.deepspeed.optimizer, p.muon).stateNames) names.push_back(s);
    for (const std::string& name : names) {
      auto it = runs.find({static_cast<int>(i), name});
      if (it == runs.end()) return invalidArgument("{}: no file holds {} of parameter {}", tagDir_, name, p.name);
      std::vector<StoredRun>& list = it->second;
      std::stable_sort(list.begin(), list.end(), [](const StoredRun& a, const StoredRun& b) { return a.whole < b.whole; });
      std::vector<SourceRange>& out = states_[{p.name, name}];
      int64_t covered = 0;
      for (const StoredRun& r : list) {
        if (r.whole + r.length <= covered) continue;
        if (r.whole > covered)
          return invalidArgument("{}: elements [{}, {}) of {}'s {} are in no file", tagDir_, covered, r.whole, p.name, name);
        const int64_t skip = covered - r.whole;
        out.push_back({.file = r.file, .offset = r.offset + skip * kF32, .bytes = (r.length - skip) * kF32});
        covered = r.whole + r.length;
      }
      if (covered != p.numel())
        return invalidArgument("{}: {}'s {} covers {} of its {} elements", tagDir_, p.name, name, covered, p.numel());
    }
  }
  return Status::ok();
}

std::string LoomCheckpoint::describe() const {
  const planner::PlanMesh& m = layout_.plan.mesh;
  return fmt::format("{}, Loom, ZeRO stage {} over {} ranks (data parallel {} x sequence parallel {} x tensor parallel {})",
                     tagDir_, layout_.deepspeed.zero.stage, m.world, m.dp, m.sp, m.tp);
}

Status LoomCheckpoint::read(const SourceRange& range, const std::string& name, void* out) const {
  return files_[range.file]->read(range.offset, range.bytes, out).withContext("tensor " + name);
}

const std::vector<SourceRange>* LoomCheckpoint::state(const std::string& name, const std::string& state) const {
  auto it = states_.find({name, state});
  return it == states_.end() ? nullptr : &it->second;
}

std::optional<ResumableCheckpoint::RankTensor> LoomCheckpoint::rankTensor(int rank, const std::string& name) const {
  auto k = fileIndex_.find(checkpoint::rankFileName(rank % layout_.plan.mesh.world));
  if (k == fileIndex_.end()) return std::nullopt;
  const checkpoint::StoredTensor* stored = files_[k->second]->find(name);
  if (!stored) return std::nullopt;
  return RankTensor{.range = {.file = k->second, .offset = stored->offset, .bytes = stored->entry.bytes()},
                    .dtype = stored->entry.dtype,
                    .shape = stored->entry.shape};
}

}  // namespace loom::convert
