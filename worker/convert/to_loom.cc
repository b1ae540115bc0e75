#include "worker/convert/to_loom.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/safetensors_writer.h"
#include "worker/checkpoint/shard_layout.h"
#include "worker/convert/chunk_copy.h"
#include "worker/convert/to_hf.h"

namespace loom::worker {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kF32 = 4;

Status copyFileDurably(const std::string& from, const std::string& to) {
  ASSIGN_OR_RETURN(auto writer, files::AtomicFileWriter::open(to));
  std::FILE* in = std::fopen(from.c_str(), "rb");
  if (!in) return notFound("{}: cannot open", from);
  std::vector<char> chunk(convert::kStateChunkBytes);
  size_t n;
  Status status = Status::ok();
  while (status.isOk() && (n = std::fread(chunk.data(), 1, chunk.size(), in)) > 0) status = writer->append(chunk.data(), n);
  const bool failed = std::ferror(in);
  std::fclose(in);
  RETURN_IF_ERROR(status);
  if (failed) return internalError("{}: read failed", from);
  return writer->commit();
}

int64_t fileSize(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

}  // namespace

LoomWriter::LoomWriter(const convert::ResumableCheckpoint& source, convert::LayoutPlan target)
    : source_(source), target_(std::move(target)) {}

Status LoomWriter::prepare() {
  ASSIGN_OR_RETURN(layout_, checkpoint::stateLayout(target_.plan, target_.deepspeed));
  // Every piece of state the target keeps must be in the source.
  for (const auto& f : layout_.files) {
    for (const auto& t : f.tensors) {
      for (const auto& piece : t.pieces) {
        const std::string& name = target_.plan.parameters[piece.parameter].name;
        if (!source_.state(name, t.state))
          return invalidArgument("{}: has no {} of parameter {}, which the layout's optimizer ({}) keeps",
                                 source_.tagDir(), t.state, name,
                                 planner::optimizerTypeName(target_.deepspeed.optimizer.type));
      }
    }
  }
  for (const auto& f : layout_.files)
    for (const auto& t : f.tensors) largest_ = std::max(largest_, t.numel() * kF32);
  if (source_.modelFiles().empty()) {
    int64_t bytes = 0;
    for (const auto& t : source_.tensors()) {
      bytes += t.bytes();
      largest_ = std::max(largest_, t.bytes());
    }
    outputs_.push_back({.name = "model.safetensors", .bytes = bytes, .model = true});
  }
  for (const std::string& name : source_.modelFiles())
    outputs_.push_back({.name = name, .bytes = fileSize(source_.tagDir() + "/" + name)});
  outputs_.push_back({.name = "config.json", .bytes = static_cast<int64_t>(source_.modelConfigText().size())});
  outputs_.push_back({.name = "trainer_state.json"});
  std::map<std::string, const checkpoint::StateFile*> stateOf;
  for (const auto& f : layout_.files) stateOf[f.file] = &f;
  auto stateBytes = [](const checkpoint::StateFile* f) {
    int64_t bytes = 0;
    if (f)
      for (const auto& t : f->tensors) bytes += t.numel() * kF32;
    return bytes;
  };
  const checkpoint::StateFile* whole = stateOf.count("optimizer.safetensors") ? stateOf["optimizer.safetensors"] : nullptr;
  outputs_.push_back({.name = "optimizer.safetensors", .bytes = stateBytes(whole), .state = whole});
  for (int r = 0; r < target_.plan.mesh.world; ++r) {
    const std::string name = checkpoint::rankFileName(r);
    const checkpoint::StateFile* f = stateOf.count(name) ? stateOf[name] : nullptr;
    outputs_.push_back({.name = name, .bytes = stateBytes(f), .state = f, .rank = r});
  }
  return Status::ok();
}

int64_t LoomWriter::totalBytes() const {
  int64_t bytes = 0;
  for (const auto& o : outputs_) bytes += o.bytes;
  return bytes;
}

int64_t LoomWriter::shareBytes(int rank, int ranks) const {
  int64_t bytes = 0;
  for (size_t i = rank; i < outputs_.size(); i += ranks) bytes += outputs_[i].bytes;
  return bytes;
}

std::string LoomWriter::trainerStateText() const {
  json t = source_.trainerState();
  const planner::PlanMesh& m = target_.plan.mesh;
  t.erase("tag");
  t["dp_world_size"] = m.denseData();
  t["tensor_parallel"] = m.tp;
  t["sequence_parallel"] = m.sp;
  t["expert_parallel"] = m.ep;
  t["zero_stage"] = target_.deepspeed.zero.stage;
  t["deepspeed"] = target_.deepspeed.toJson();
  t["converted_from"] = source_.tagDir();
  return t.dump(2);
}

Status LoomWriter::writeShare(const std::string& dir, int rank, int ranks, ConvertProgress& progress) {
  const std::string tagDir = dir + "/" + source_.tag();
  RETURN_IF_ERROR(files::makeDirs(tagDir));
  for (size_t i = rank; i < outputs_.size(); i += ranks) RETURN_IF_ERROR(writeOutput(tagDir, outputs_[i], progress));
  return Status::ok();
}

Status LoomWriter::writeOutput(const std::string& tagDir, const Output& out, ConvertProgress& progress) {
  const std::string path = tagDir + "/" + out.name;
  if (out.name == "config.json") {
    RETURN_IF_ERROR(files::writeFileAtomic(path, source_.modelConfigText()));
  } else if (out.name == "trainer_state.json") {
    RETURN_IF_ERROR(files::writeFileAtomic(path, trainerStateText()));
  } else if (out.state || out.rank >= 0 || out.name == "optimizer.safetensors") {
    return writeStateFile(path, out, progress);
  } else if (out.model) {
    // The weights in the model's dtype, as the trainer keeps them (its masters rounded to bf16).
    planner::ConvertSpec spec;
    spec.dtype = target_.deepspeed.precision == planner::Precision::kBf16 ? "bf16" : "fp32";
    HfWriter model(source_, spec);
    RETURN_IF_ERROR(model.check());
    RETURN_IF_ERROR(model.writeShare(tagDir, 0, 1, progress));
    return model.complete(tagDir);
  } else {
    RETURN_IF_ERROR(copyFileDurably(source_.tagDir() + "/" + out.name, path));
  }
  progress.tensorDone(out.bytes);
  return Status::ok();
}

Status LoomWriter::writeStateFile(const std::string& path, const Output& out, ConvertProgress& progress) {
  const planner::Plan& plan = target_.plan;
  std::vector<checkpoint::SafetensorsEntry> entries;
  const std::vector<checkpoint::StateTensor> none;
  const auto& tensors = out.state ? out.state->tensors : none;
  for (const auto& t : tensors) entries.push_back({t.name, "F32", t.shape});
  if (out.state) entries.push_back({"step", "I64", {1}});
  std::optional<convert::ResumableCheckpoint::RankTensor> rng;
  if (out.rank >= 0) rng = source_.rankTensor(out.rank, "rng");
  if (rng) entries.push_back({"rng", rng->dtype, rng->shape});
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Each source state's ranges with their first elements, found once per file.
  std::map<std::pair<int, std::string>, std::vector<int64_t>> starts;
  std::vector<char> chunk(convert::kStateChunkBytes);
  const checkpoint::BytesProducer produce = [&](size_t i, const checkpoint::ByteSink& sink) -> Status {
    if (out.state && i == tensors.size()) {
      const int64_t steps = source_.optimizerSteps();
      return sink(&steps, sizeof(steps));
    }
    if (i >= tensors.size()) {
      std::vector<char> bytes(static_cast<size_t>(rng->range.bytes));
      RETURN_IF_ERROR(source_.read(rng->range, "rng", bytes.data()));
      return sink(bytes.data(), bytes.size());
    }
    const checkpoint::StateTensor& t = tensors[i];
    convert::ChunkBuffer buffer(chunk, sink);
    int64_t cursor = 0;
    for (const checkpoint::StatePiece& piece : t.pieces) {
      const std::string& name = plan.parameters[piece.parameter].name;
      const std::vector<convert::SourceRange>* ranges = source_.state(name, t.state);
      if (!ranges) return invalidArgument("convert.from: {} has no {} for parameter {}", source_.tagDir(), t.state, name);
      auto [it, added] = starts.try_emplace({piece.parameter, t.state});
      if (added) it->second = convert::rangeStarts(*ranges);
      RETURN_IF_ERROR(buffer.zeros((piece.at - cursor) * kF32));
      const auto shard = checkpoint::shardLayout(plan.parameters[piece.parameter], out.state->tpRank, plan.mesh.tp);
      for (const checkpoint::ElementRun& run : checkpoint::wholeRuns(shard, piece.offset, piece.length))
        RETURN_IF_ERROR(convert::copyWhole(source_, *ranges, it->second, run.whole, run.length, name + " " + t.state, buffer));
      cursor = piece.at + piece.length;
    }
    RETURN_IF_ERROR(buffer.zeros((t.numel() - cursor) * kF32));
    RETURN_IF_ERROR(buffer.flush());
    progress.tensorDone(t.numel() * kF32);
    return Status::ok();
  };
  return checkpoint::writeSafetensorsFile(path, entries, order, produce).withContext("convert.output");
}

Status LoomWriter::complete(const std::string& dir) const {
  RETURN_IF_ERROR(checkpoint::writeManifest(dir + "/" + source_.tag(), source_.tag()));
  return files::writeFileAtomic(dir + "/latest", source_.tag() + "\n");
}

}  // namespace loom::worker
