#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "planner/model_config.h"
#include "worker/convert/zip_archive.h"

namespace loom::convert {

// Bytes of one of a checkpoint's files: a member of a torch.save archive, or a plain file (a
// safetensors file) when `member` is null.
struct SourceRange {
  int file = 0;                      // the source's own numbering of its files
  const ZipEntry* member = nullptr;
  int64_t offset = 0;                // within the member, or the file
  int64_t bytes = 0;
};

// One tensor of the consolidated model and where its bytes lie: its ranges, end to end, are its
// elements in row-major order.
struct SourceTensor {
  std::string name;
  std::string dtype;  // as torch.save names it: "float32", "bfloat16", "int64", ...
  int64_t elementBytes = 0;
  std::vector<int64_t> shape;
  std::vector<SourceRange> ranges;
  enum class Role { kTrainable, kFrozen, kBuffer } role = Role::kTrainable;

  int64_t numel() const;
  int64_t bytes() const { return numel() * elementBytes; }
};

// A checkpoint the convert job reads: the model it consolidates to, tensor by tensor (the fp32
// masters of what trains, the rest as stored), and the bytes of each, read on demand so that no
// more than one chunk is held.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  // One line for the job's log: what was opened.
  virtual std::string describe() const = 0;
  virtual const std::vector<SourceTensor>& tensors() const = 0;
  // Tied parameters the model holds once (lm_head.weight -> model.embed_tokens.weight); empty
  // when every tensor is stored under its own name.
  virtual size_t tiedCount() const { return 0; }
  // The bytes of one range (or a part of one) of tensor `name` into `out`.
  virtual Status read(const SourceRange& range, const std::string& name, void* out) const = 0;
};

// A checkpoint that training resumes from, as a conversion to a Loom checkpoint reads it: beyond
// its model, each trained parameter's fp32 state (its master and the optimizer's moments) and
// where training stood.
class ResumableCheckpoint : public CheckpointSource {
 public:
  // Parameter `name`'s fp32 state `state` ("master", or the optimizer's "exp_avg", ...), whole, in
  // row-major order; null when the checkpoint has none.
  virtual const std::vector<SourceRange>* state(const std::string& name, const std::string& state) const = 0;
  // The optimizer's step count: the updates it has applied.
  virtual int64_t optimizerSteps() const = 0;
  // trainer_state.json as Loom keeps it (step, applied_steps, skipped_steps, consumed_samples,
  // train_batch_size, loss_scaler, frozen_parameters, deepspeed: the config it trained with).
  virtual const nlohmann::json& trainerState() const = 0;
  virtual const std::string& tag() const = 0;
  virtual const std::string& modelConfigText() const = 0;
  virtual const planner::ModelConfig& model() const = 0;
  virtual const std::vector<std::string>& frozen() const = 0;
  // The tag directory and its model files (relative to it) when they can be copied as they are
  // (a Loom checkpoint's); empty when the model is written from tensors().
  virtual const std::string& tagDir() const = 0;
  virtual const std::vector<std::string>& modelFiles() const = 0;
  // A tensor of the rank file that target rank `rank` takes its own from (its "rng"): the source's
  // rank `rank` mod its ranks. Where it lies and what it is; nullopt when absent.
  struct RankTensor {
    SourceRange range;
    std::string dtype;
    std::vector<int64_t> shape;
  };
  virtual std::optional<RankTensor> rankTensor(int rank, const std::string& name) const { return std::nullopt; }
};

// A Loom training checkpoint (a tag directory with manifest.json and trainer_state.json, or the
// directory whose `latest` names one) or a DeepSpeed one, by what `from` holds.
StatusOr<std::unique_ptr<CheckpointSource>> openCheckpoint(const std::string& from);
// The same as a checkpoint to resume from: a Loom one as it is, a DeepSpeed one with the model's
// config.json at `modelConfig` (convert.config), which DeepSpeed does not keep; where the target
// does not need the model (`needModel` false: a universal checkpoint), it may be empty.
StatusOr<std::unique_ptr<ResumableCheckpoint>> openResumable(const std::string& from, const std::string& modelConfig,
                                                             bool needModel);

}  // namespace loom::convert
