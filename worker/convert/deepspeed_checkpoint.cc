#include "worker/convert/deepspeed_checkpoint.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/files.h"

namespace loom::convert {

namespace {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

// DeepSpeed's natural order of rank files (zero_pp_rank_10 after zero_pp_rank_9).
bool naturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const unsigned long long x = std::stoull(a.substr(i, ie - i)), y = std::stoull(b.substr(j, je - j));
      if (x != y) return x < y;
      i = ie, j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The files of a tag directory that end with `suffix`, in DeepSpeed's order.
std::vector<std::string> filesEnding(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && endsWith(e.path().filename().string(), suffix)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end(), naturalLess);
  return out;
}

// An int, or an int enum (ZeroStageEnum(2)).
StatusOr<int64_t> intOf(const PickleValue* v, const std::string& what) {
  if (v && v->kind == Kind::kInt) return v->integer;
  if (v && v->kind == Kind::kObject && v->items.size() == 1 && v->items[0]->kind == Kind::kInt)
    return v->items[0]->integer;
  return invalidArgument("{}: not an integer", what);
}

StatusOr<std::vector<int64_t>> shapeOf(const PickleValue& v, const std::string& what) {
  if (!v.isSequence()) return invalidArgument("{}: the shape is a {}, not a torch.Size", what, v.kindName());
  std::vector<int64_t> shape;
  __int128 elements = 1;
  for (const auto& d : v.items) {
    if (d->kind != Kind::kInt || d->integer < 0) return invalidArgument("{}: a dimension that is not a size", what);
    shape.push_back(d->integer);
    elements *= d->integer;
    if (elements > (__int128(1) << 62)) return invalidArgument("{}: more than 2^62 elements", what);
  }
  return shape;
}

// Elements laid end to end over several tensors' bytes: a rank's flat partition, or its stage-3
// sub-groups one after another.
struct Flat {
  std::vector<SourceRange> segments;
  int64_t elementBytes = 4;
  int64_t elements = 0;
};

}  // namespace



namespace {

class Loader {
 public:
  Loader(std::vector<std::unique_ptr<ZipArchive>>& archives) : archives_(archives) {}

  // The pickle of a .pt file, its archive kept for the tensors' bytes.
  StatusOr<std::pair<int, PickleRef>> load(const std::string& path) {
    ASSIGN_OR_RETURN(ZipArchive zip, ZipArchive::open(path));
    const ZipEntry* pickle = zip.find("data.pkl");
    if (!pickle) return invalidArgument("{}: no data.pkl: not a file torch.save wrote", path);
    ASSIGN_OR_RETURN(std::string bytes, zip.readAll(*pickle));
    ASSIGN_OR_RETURN(PickleRef root, readTorchPickle(bytes, path + " (data.pkl)"));
    if (root->kind != Kind::kDict) return invalidArgument("{}: holds a {}, not a checkpoint's dict", path, root->kindName());
    archives_.push_back(std::make_unique<ZipArchive>(std::move(zip)));
    return std::make_pair(static_cast<int>(archives_.size()) - 1, root);
  }

  // Where a pickled tensor's bytes are; it must be contiguous and inside its storage's member.
  StatusOr<SourceRange> rangeOf(int archive, const PickleValue& v, const std::string& what) const {
    const ZipArchive& zip = *archives_[archive];
    if (v.kind != Kind::kTensor) return invalidArgument("{}: {}: a {}, not a tensor", zip.path(), what, v.kindName());
    const TensorRef& t = v.tensor;
    if (!t.contiguous())
      return invalidArgument("{}: {}: the tensor is not contiguous in its storage", zip.path(), what);
    const ZipEntry* member = zip.find("data/" + t.storage);
    if (!member) return invalidArgument("{}: {}: its storage data/{} is missing", zip.path(), what, t.storage);
    const int64_t begin = t.offset * t.elementBytes, bytes = t.numel() * t.elementBytes;
    if (begin > member->size || bytes > member->size - begin)
      return invalidArgument("{}: {}: its {} bytes at {} run past its storage data/{} ({} bytes)", zip.path(), what,
                             bytes, begin, t.storage, member->size);
    return SourceRange{.file = archive, .member = member, .offset = begin, .bytes = bytes};
  }

  const ZipArchive& archive(int i) const { return *archives_[i]; }

 private:
  std::vector<std::unique_ptr<ZipArchive>>& archives_;
};

// Appends to `out` the ranges of elements [from, from + count) of `flat`.
Status take(const Flat& flat, int64_t from, int64_t count, std::vector<SourceRange>* out) {
  if (from < 0 || count < 0 || from > flat.elements || count > flat.elements - from)
    return invalidArgument("elements [{}, {}) of a partition of {}", from, from + count, flat.elements);
  int64_t skip = from * flat.elementBytes, left = count * flat.elementBytes;
  for (const SourceRange& s : flat.segments) {
    if (left == 0) break;
    if (skip >= s.bytes) {
      skip -= s.bytes;
      continue;
    }
    const int64_t n = std::min(left, s.bytes - skip);
    out->push_back(SourceRange{.file = s.file, .member = s.member, .offset = s.offset + skip, .bytes = n});
    left -= n;
    skip = 0;
  }
  return Status::ok();
}

StatusOr<Flat> flatOf(const Loader& loader, int archive, const PickleValue* tensors, const std::string& key) {
  const std::string& path = loader.archive(archive).path();
  if (!tensors || tensors->kind != Kind::kList)
    return invalidArgument("{}: optimizer_state_dict.{}: missing, or not a list of tensors", path, key);
  Flat flat;
  for (size_t g = 0; g < tensors->items.size(); ++g) {
    const PickleValue& t = *tensors->items[g];
    const std::string what = fmt::format("optimizer_state_dict.{}[{}]", key, g);
    if (t.kind != Kind::kTensor || t.tensor.dtype != "float32" || t.tensor.shape.size() != 1)
      return invalidArgument("{}: {}: not a flat fp32 tensor", path, what);
    ASSIGN_OR_RETURN(SourceRange r, loader.rangeOf(archive, t, what));
    flat.segments.push_back(r);
    flat.elements += t.tensor.numel();
  }
  return flat;
}

// A pickled config (dicts, lists, strings, numbers) as JSON; anything else becomes null.
nlohmann::json toJson(const PickleValue& v) {
  switch (v.kind) {
    case Kind::kBool: return v.boolean;
    case Kind::kInt: return v.integer;
    case Kind::kFloat: return v.real;
    case Kind::kString: return v.text;
    case Kind::kTuple:
    case Kind::kList: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& item : v.items) out.push_back(toJson(*item));
      return out;
    }
    case Kind::kDict: {
      nlohmann::json out = nlohmann::json::object();
      for (size_t k = 0; k + 1 < v.items.size(); k += 2)
        if (v.items[k]->isString()) out[v.items[k]->text] = toJson(*v.items[k + 1]);
      return out;
    }
    default: return nullptr;
  }
}

// The optimizer's per-group state dicts (torch's state_dict()["state"]: group index -> {"step",
// "exp_avg", ...}), in group order: base_optimizer_state at stages 1-2, the inner
// optimizer_state_dict at stage 3 (one per sub-group).
std::vector<const PickleValue*> groupStates(const PickleValue& optimizerState, int64_t zeroStage) {
  const PickleValue* inner = optimizerState.get(zeroStage <= 2 ? "base_optimizer_state" : "optimizer_state_dict");
  const PickleValue* states = inner ? inner->get("state") : nullptr;
  std::vector<const PickleValue*> out;
  if (!states || states->kind != Kind::kDict) return out;
  for (size_t k = 0; k + 1 < states->items.size(); k += 2) {
    const PickleValue& key = *states->items[k];
    if (key.kind != Kind::kInt || key.integer != static_cast<int64_t>(out.size())) return {};
    out.push_back(states->items[k + 1].get());
  }
  return out;
}

// The names of the flat fp32 tensors each group's state keeps ("exp_avg", "exp_avg_sq"): those of
// the first group, which every group and rank must have.
std::vector<std::string> stateTensorNames(const std::vector<const PickleValue*>& states) {
  std::vector<std::string> names;
  if (states.empty() || states[0]->kind != Kind::kDict) return names;
  for (size_t k = 0; k + 1 < states[0]->items.size(); k += 2) {
    if (states[0]->items[k]->isString() && states[0]->items[k + 1]->kind == Kind::kTensor &&
        states[0]->items[k]->text != "step")
      names.push_back(states[0]->items[k]->text);
  }
  return names;
}

}  // namespace

// DeepSpeedCheckpoint::open's work, part by part, over what the parts share: the tag's files and
// their pickles, the stage and world, and every rank's flat partitions.
struct DeepSpeedOpening {
  DeepSpeedCheckpoint* ckpt;
  Loader loader;
  std::vector<std::string> models, optims;  // the tag's *model_states.pt, *optim_states.pt
  std::pair<int, PickleRef> model0;         // the first model states file: its archive and pickle
  std::vector<std::pair<int, PickleRef>> optimizers;
  const PickleValue* state0 = nullptr;      // rank 0's optimizer_state_dict
  int64_t zeroStage = 0, world = 0;
  std::string flatKey;
  std::vector<std::vector<Flat>> groups;  // stages 1-2: [rank][group]; stage 3: [rank][0], all sub-groups
  std::map<std::string, std::vector<std::vector<Flat>>> moments;  // by name, as `groups`
  std::set<std::string> names;            // every tensor taken so far

  DeepSpeedOpening(DeepSpeedCheckpoint* c, std::vector<std::unique_ptr<ZipArchive>>& archives)
      : ckpt(c), loader(archives) {}
  const PickleValue& model() const { return *model0.second; }
  Status addName(const std::string& name) {
    if (!names.insert(name).second)
      return invalidArgument("{}: tensor {} appears twice (param_shapes, frozen_param_shapes, buffers)", models[0], name);
    return Status::ok();
  }

  // The tag directory, its files, and their pickles.
  Status readFiles(const std::string& dir) {
    // The tag `latest` names, or the directory itself.
    if (fs::exists(dir + "/latest")) {
      ASSIGN_OR_RETURN(std::string tag, files::readFile(dir + "/latest"));
      while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
      if (tag.empty() || tag.find('/') != std::string::npos)
        return invalidArgument("{}/latest: \"{}\" is not a tag", dir, tag);
      ckpt->tagDir_ = dir + "/" + tag;
    } else {
      ckpt->tagDir_ = dir;
    }
    models = filesEnding(ckpt->tagDir_, "model_states.pt");
    optims = filesEnding(ckpt->tagDir_, "optim_states.pt");
    if (models.empty())
      return invalidArgument("{}: no *model_states.pt: not a DeepSpeed checkpoint (a checkpoint directory has a "
                             "`latest` file naming its tag)",
                             ckpt->tagDir_);
    if (optims.empty())
      return invalidArgument("{}: no *optim_states.pt: DeepSpeed's consolidation needs the ZeRO partitions", ckpt->tagDir_);

    ASSIGN_OR_RETURN(model0, loader.load(models[0]));
    for (const auto& path : optims) {
      ASSIGN_OR_RETURN(auto loaded, loader.load(path));
      optimizers.push_back(std::move(loaded));
    }
    return Status::ok();
  }

  // The ZeRO stage, the world, and where training stood.
  Status readStage() {
    const std::string& optim0 = optims[0];
    state0 = optimizers[0].second->get("optimizer_state_dict");
    if (!state0 || state0->kind != Kind::kDict)
      return invalidArgument("{}: no optimizer_state_dict: not a ZeRO optimizer's file", optim0);
    const PickleValue* stage = state0->get("zero_stage");
    if (!stage)
      return invalidArgument("{}: optimizer_state_dict has no zero_stage: not a ZeRO checkpoint (DeepSpeed's "
                             "BF16_Optimizer, ZeRO 1 with bf16 and fp32 gradient accumulation, writes such files; its "
                             "zero_to_fp32 refuses them too)",
                             optim0);
    ASSIGN_OR_RETURN(zeroStage, intOf(stage, optim0 + ": optimizer_state_dict.zero_stage"));
    if (zeroStage < 1 || zeroStage > 3)
      return invalidArgument("{}: zero_stage {}: stages 1 to 3 are consolidated", optim0, zeroStage);
    ckpt->zeroStage_ = static_cast<int>(zeroStage);
    // The world: the largest partition count.
    const PickleValue* counts = state0->get("partition_count");
    if (counts && counts->isSequence()) {
      for (const auto& c : counts->items) {
        ASSIGN_OR_RETURN(int64_t n, intOf(c.get(), optim0 + ": optimizer_state_dict.partition_count"));
        world = std::max(world, n);
      }
    } else {
      ASSIGN_OR_RETURN(world, intOf(counts, optim0 + ": optimizer_state_dict.partition_count"));
    }
    if (world != static_cast<int64_t>(optims.size()))
      return invalidArgument("{}: the partitions are over {} ranks, but {} holds {} *optim_states.pt files", optim0,
                             world, ckpt->tagDir_, optims.size());
    ckpt->worldSize_ = static_cast<int>(world);
    if (const PickleValue* v = model().get("ds_version"); v && v->isString()) ckpt->version_ = v->text;
    for (auto [key, into] : {std::pair{"global_steps", &ckpt->globalSteps_}, std::pair{"skipped_steps", &ckpt->skippedSteps_},
                             std::pair{"global_samples", &ckpt->globalSamples_}}) {
      if (const PickleValue* v = model().get(key); v && v->kind == Kind::kInt) *into = v->integer;
    }
    if (const PickleValue* config = model().get("ds_config")) ckpt->config_ = toJson(*config);
    return Status::ok();
  }

  // Every rank's fp32 partitions, and the optimizer's moments.
  Status readPartitions() {
    // Every rank's fp32 partitions, of the same stage, and the optimizer's moments laid out as they are.
    flatKey = zeroStage <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups";
    groups.resize(world);
    ckpt->momentNames_ = stateTensorNames(groupStates(*state0, zeroStage));
    for (const auto& name : ckpt->momentNames_) moments[name].resize(world);
    for (int64_t r = 0; r < world; ++r) {
      const auto& [archive, root] = optimizers[r];
      const PickleValue* state = root->get("optimizer_state_dict");
      const std::string& path = optims[r];
      if (!state || state->kind != Kind::kDict) return invalidArgument("{}: no optimizer_state_dict", path);
      ASSIGN_OR_RETURN(int64_t s, intOf(state->get("zero_stage"), path + ": optimizer_state_dict.zero_stage"));
      if (s != zeroStage)
        return invalidArgument("{}: written at ZeRO stage {}, {} at stage {}: files of two checkpoints", path, s, optims[0],
                               zeroStage);
      const PickleValue* tensors = state->get(flatKey);
      // Each moment as a list of flat tensors, one per group (stages 1-2) or sub-group (stage 3).
      const std::vector<const PickleValue*> perGroup = groupStates(*state, zeroStage);
      for (const auto& name : ckpt->momentNames_) {
        auto list = std::make_shared<PickleValue>();
        list->kind = Kind::kList;
        for (size_t g = 0; g < perGroup.size(); ++g) {
          const PickleValue* t = perGroup[g]->get(name);
          if (!t) return invalidArgument("{}: optimizer state of group {} has no {}", path, g, name);
          list->items.push_back(std::make_shared<PickleValue>(*t));
        }
        const std::string key = fmt::format("{}.state[].{}", zeroStage <= 2 ? "base_optimizer_state" : "optimizer_state_dict", name);
        if (zeroStage <= 2) {
          for (size_t g = 0; g < list->items.size(); ++g) {
            auto one = std::make_shared<PickleValue>();
            one->kind = Kind::kList;
            one->items = {list->items[g]};
            ASSIGN_OR_RETURN(Flat f, flatOf(loader, archive, one.get(), key));
            moments[name][r].push_back(std::move(f));
          }
        } else {
          ASSIGN_OR_RETURN(Flat f, flatOf(loader, archive, list.get(), key));
          moments[name][r].push_back(std::move(f));
        }
      }
      if (zeroStage <= 2) {
        if (!tensors || tensors->kind != Kind::kList)
          return invalidArgument("{}: optimizer_state_dict.{}: missing", path, flatKey);
        for (size_t g = 0; g < tensors->items.size(); ++g) {
          auto one = std::make_shared<PickleValue>();
          one->kind = Kind::kList;
          one->items = {tensors->items[g]};
          ASSIGN_OR_RETURN(Flat f, flatOf(loader, archive, one.get(), fmt::format("{}[{}]", flatKey, g)));
          groups[r].push_back(std::move(f));
        }
      } else {
        ASSIGN_OR_RETURN(Flat f, flatOf(loader, archive, tensors, flatKey));
        groups[r].push_back(std::move(f));
      }
    }
    return Status::ok();
  }

  // Each trainable parameter's master (and moments) from the partitions, by param_shapes.
  Status readTrainable() {
    // param_shapes: one ordered dict of name -> shape per parameter group.
    const PickleValue* shapes = model().get("param_shapes");
    if (!shapes || !shapes->isSequence())
      return invalidArgument("{}: param_shapes: missing, or not a list of parameter groups", models[0]);
    const PickleValue* paddings = state0->get("param_alignment_paddings");
    int64_t stage3Offset = 0;
    for (size_t g = 0; g < shapes->items.size(); ++g) {
      const PickleValue& group = *shapes->items[g];
      if (group.kind != Kind::kDict) return invalidArgument("{}: param_shapes[{}] is not a dict", models[0], g);
      if (zeroStage <= 2 && g >= groups[0].size())
        return invalidArgument("{}: param_shapes has {} groups, the fp32 partitions {}", models[0], shapes->items.size(),
                               groups[0].size());
      // Stages 1-2: this group's partitions, rank after rank (and its moments', which lie alike).
      Flat merged;
      std::map<std::string, Flat> mergedMoments;
      if (zeroStage <= 2) {
        for (int64_t r = 0; r < world; ++r) {
          if (g >= groups[r].size())
            return invalidArgument("{}: rank {} has {} fp32 partitions, rank 0 {}", optims[r], r, groups[r].size(),
                                   groups[0].size());
          for (const auto& s : groups[r][g].segments) merged.segments.push_back(s);
          merged.elements += groups[r][g].elements;
          for (auto& [name, flats] : moments) {
            if (g >= flats[r].size() || flats[r][g].elements != groups[r][g].elements)
              return invalidArgument("{}: group {}'s {} does not match its fp32 partition", optims[r], g, name);
            Flat& m = mergedMoments[name];
            for (const auto& s : flats[r][g].segments) m.segments.push_back(s);
            m.elements += flats[r][g].elements;
          }
        }
      }
      int64_t offset = 0;
      for (size_t k = 0; k + 1 < group.items.size(); k += 2) {
        if (!group.items[k]->isString()) return invalidArgument("{}: param_shapes[{}]: a name that is not a string", models[0], g);
        SourceTensor t{.name = group.items[k]->text, .dtype = "float32", .elementBytes = 4};
        ASSIGN_OR_RETURN(t.shape, shapeOf(*group.items[k + 1], models[0] + ": param_shapes: " + t.name));
        RETURN_IF_ERROR(addName(t.name));
        const int64_t numel = t.numel();
        if (zeroStage <= 2) {
          Status taken = take(merged, offset, numel, &t.ranges);
          for (const auto& [name, m] : mergedMoments)
            if (taken.isOk()) taken = take(m, offset, numel, &ckpt->moments_[{t.name, name}]);
          if (!taken.isOk())
            return invalidArgument("{}: param_shapes: {} {} does not fit parameter group {}'s fp32 partitions ({} "
                                   "elements over {} ranks): the shapes and the partitions disagree",
                                   models[0], t.name, fmt::format("[{}]", fmt::join(t.shape, ", ")), g, merged.elements,
                                   world);
          int64_t padding = 0;
          if (paddings && paddings->isSequence() && g < paddings->items.size() && paddings->items[g]->isSequence() &&
              k / 2 < paddings->items[g]->items.size()) {
            ASSIGN_OR_RETURN(padding, intOf(paddings->items[g]->items[k / 2].get(), "param_alignment_paddings"));
          }
          offset += numel + padding;
        } else {
          // ceil(numel / world) elements from each rank, the padding at the end of the last.
          const int64_t part = (numel + world - 1) / world;
          int64_t left = numel;
          for (int64_t r = 0; r < world; ++r) {
            const int64_t n = std::min(part, left);
            Status taken = take(groups[r][0], stage3Offset, n, &t.ranges);
            for (const auto& [name, flats] : moments)
              if (taken.isOk()) taken = take(flats[r][0], stage3Offset, n, &ckpt->moments_[{t.name, name}]);
            if (!taken.isOk())
              return invalidArgument("{}: param_shapes: {} needs elements [{}, {}) of rank {}'s fp32_flat_groups, "
                                     "which hold {}: the shapes and the partitions disagree",
                                     models[0], t.name, stage3Offset, stage3Offset + n, r, groups[r][0].elements);
            left -= n;
          }
          stage3Offset += part;
        }
        ckpt->tensors_.push_back(std::move(t));
      }
      if (zeroStage <= 2) {
        // Each group is padded to a multiple of 2 x world (and its partitions' tail trimmed).
        const int64_t align = 2 * world;
        auto up = [&](int64_t x) { return (x + align - 1) / align * align; };
        if (up(offset) != up(merged.elements))
          return invalidArgument("{}: parameter group {}: param_shapes account for {} elements, its fp32 partitions "
                                 "hold {}: the shapes and the partitions disagree",
                                 models[0], g, offset, merged.elements);
      }
    }
    if (zeroStage == 3) {
      for (int64_t r = 0; r < world; ++r) {
        if (groups[r][0].elements != stage3Offset)
          return invalidArgument("{}: its fp32_flat_groups hold {} elements, param_shapes account for {} per rank",
                                 optims[r], groups[r][0].elements, stage3Offset);
      }
    }
    return Status::ok();
  }

  Status readFrozen() {
    // Frozen parameters: whole on rank 0 (stages 1-2), or a fragment on every rank (stage 3).
    const PickleValue* frozenShapes = model().get("frozen_param_shapes");
    if (frozenShapes && frozenShapes->kind == Kind::kDict) {
      std::vector<std::pair<int, PickleRef>> rankModels{model0};
      if (zeroStage == 3) {
        if (static_cast<int64_t>(models.size()) != world)
          return invalidArgument("{}: {} *model_states.pt files for {} ranks", ckpt->tagDir_, models.size(), world);
        for (size_t r = 1; r < models.size(); ++r) {
          ASSIGN_OR_RETURN(auto loaded, loader.load(models[r]));
          rankModels.push_back(std::move(loaded));
        }
      }
      for (size_t k = 0; k + 1 < frozenShapes->items.size(); k += 2) {
        SourceTensor t{.name = frozenShapes->items[k]->text, .role = SourceTensor::Role::kFrozen};
        ASSIGN_OR_RETURN(t.shape, shapeOf(*frozenShapes->items[k + 1], models[0] + ": frozen_param_shapes: " + t.name));
        RETURN_IF_ERROR(addName(t.name));
        int64_t left = t.numel();
        for (size_t r = 0; r < rankModels.size() && left > 0; ++r) {
          const auto& [archive, root] = rankModels[r];
          const PickleValue* fragments = root->get("frozen_param_fragments");
          const PickleValue* fragment = fragments ? fragments->get(t.name) : nullptr;
          if (!fragment)
            return invalidArgument("{}: frozen_param_fragments has no {}", archive == model0.first ? models[0] : models[r],
                                   t.name);
          ASSIGN_OR_RETURN(SourceRange range, loader.rangeOf(archive, *fragment, "frozen_param_fragments." + t.name));
          t.dtype = fragment->tensor.dtype;
          t.elementBytes = fragment->tensor.elementBytes;
          const int64_t n = std::min(left, fragment->tensor.numel());
          range.bytes = n * t.elementBytes;
          t.ranges.push_back(range);
          left -= n;
        }
        if (left > 0)
          return invalidArgument("{}: frozen parameter {}: its fragments hold {} of its {} elements", models[0], t.name,
                                 t.numel() - left, t.numel());
        ckpt->tensors_.push_back(std::move(t));
      }
    }
    return Status::ok();
  }

  // Buffers, and tied parameters.
  Status readBuffersAndTies() {
    // Buffers, as the module's state dict holds them.
    const PickleValue* buffers = model().get("buffer_names");
    const PickleValue* module = model().get("module");
    if (buffers && buffers->isSequence()) {
      for (const auto& b : buffers->items) {
        if (!b->isString()) return invalidArgument("{}: buffer_names: a name that is not a string", models[0]);
        const PickleValue* tensor = module ? module->get(b->text) : nullptr;
        if (!tensor) return invalidArgument("{}: buffer {} is named in buffer_names but not in module", models[0], b->text);
        RETURN_IF_ERROR(addName(b->text));
        ASSIGN_OR_RETURN(SourceRange range, loader.rangeOf(model0.first, *tensor, "module." + b->text));
        ckpt->tensors_.push_back(SourceTensor{.name = b->text,
                                             .dtype = tensor->tensor.dtype,
                                             .elementBytes = tensor->tensor.elementBytes,
                                             .shape = tensor->tensor.shape,
                                             .ranges = {range},
                                             .role = SourceTensor::Role::kBuffer});
      }
    }

    // Tied parameters: a name not stored, and the one it shares.
    if (const PickleValue* shared = model().get("shared_params"); shared && shared->kind == Kind::kDict) {
      for (size_t k = 0; k + 1 < shared->items.size(); k += 2) {
        if (!shared->items[k]->isString() || !shared->items[k + 1]->isString())
          return invalidArgument("{}: shared_params: names that are not strings", models[0]);
        if (!names.count(shared->items[k + 1]->text))
          return invalidArgument("{}: shared_params: {} is tied to {}, which the checkpoint does not hold", models[0],
                                 shared->items[k]->text, shared->items[k + 1]->text);
        ckpt->aliases_[shared->items[k]->text] = shared->items[k + 1]->text;
      }
    }
    return Status::ok();
  }
};

StatusOr<std::unique_ptr<DeepSpeedCheckpoint>> DeepSpeedCheckpoint::open(const std::string& dir) {
  std::unique_ptr<DeepSpeedCheckpoint> ckpt(new DeepSpeedCheckpoint());
  DeepSpeedOpening o(ckpt.get(), ckpt->archives_);
  RETURN_IF_ERROR(o.readFiles(dir));
  RETURN_IF_ERROR(o.readStage());
  RETURN_IF_ERROR(o.readPartitions());
  RETURN_IF_ERROR(o.readTrainable());
  RETURN_IF_ERROR(o.readFrozen());
  RETURN_IF_ERROR(o.readBuffersAndTies());
  return ckpt;
}

const std::vector<SourceRange>* DeepSpeedCheckpoint::moment(const std::string& parameter, const std::string& name) const {
  auto it = moments_.find({parameter, name});
  return it == moments_.end() ? nullptr : &it->second;
}

std::string DeepSpeedCheckpoint::describe() const {
  return fmt::format("{}, DeepSpeed {}, ZeRO stage {} over {} ranks", tagDir_, version_.empty() ? "?" : version_,
                     zeroStage_, worldSize_);
}

Status DeepSpeedCheckpoint::read(const SourceRange& range, const std::string& name, void* out) const {
  return archives_[range.file]->read(*range.member, range.offset, range.bytes, out).withContext("tensor " + name);
}

}  // namespace loom::convert
