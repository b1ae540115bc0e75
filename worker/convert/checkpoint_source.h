#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
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

// A Loom training checkpoint (a tag directory with manifest.json and trainer_state.json, or the
// directory whose `latest` names one) or a DeepSpeed one, by what `from` holds.
StatusOr<std::unique_ptr<CheckpointSource>> openCheckpoint(const std::string& from);

}  // namespace loom::convert
