#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/convert/torch_pickle.h"
#include "worker/convert/zip_archive.h"

namespace loom::convert {

// Bytes of one member of one of a checkpoint's archives.
struct SourceRange {
  int archive = 0;
  const ZipEntry* member = nullptr;
  int64_t offset = 0;  // within the member
  int64_t bytes = 0;
};

// One tensor of the consolidated model and where its bytes lie: its ranges, end to end, are its
// elements in row-major order.
struct SourceTensor {
  std::string name;
  std::string dtype;  // as stored: "float32", "bfloat16", "int64", ...
  int64_t elementBytes = 0;
  std::vector<int64_t> shape;
  std::vector<SourceRange> ranges;
  enum class Role { kTrainable, kFrozen, kBuffer } role = Role::kTrainable;

  int64_t numel() const;
  int64_t bytes() const { return numel() * elementBytes; }
};

// A DeepSpeed 0.19.8 ZeRO stage 1, 2 or 3 checkpoint, consolidated as its zero_to_fp32.py does,
// without holding any of it: the fp32 master of every trainable parameter from the ranks' flat
// partitions (stages 1 and 2: each parameter group's partitions end to end, walked in
// param_shapes order with its alignment paddings; stage 3: ceil(numel / world) elements of each
// parameter from every rank in turn), frozen parameters from their fragments (model dtype), and
// the module's buffers as stored. Tied parameters (shared_params) are kept as aliases: HF's
// safetensors hold the tensor once. Only the pickles are read on open; the tensors' bytes are
// read by read(), one tensor at a time.
//
// Errors name the file and what does not fit: a missing `latest` or rank file, files of
// different ZeRO stages or sizes, partitions that do not add up to the parameters' shapes, a
// tensor or storage that is not where the pickle says.
class DeepSpeedCheckpoint {
 public:
  // `dir`: the checkpoint directory (its `latest` names the tag) or a tag directory.
  static StatusOr<DeepSpeedCheckpoint> open(const std::string& dir);

  const std::string& tagDir() const { return tagDir_; }
  int zeroStage() const { return zeroStage_; }
  int worldSize() const { return worldSize_; }
  const std::string& deepspeedVersion() const { return version_; }
  const std::vector<SourceTensor>& tensors() const { return tensors_; }
  // Tied names: the name not stored -> the stored one (lm_head.weight -> model.embed_tokens.weight).
  const std::map<std::string, std::string>& aliases() const { return aliases_; }

  // The tensor's bytes (t.bytes() of them) into `out`.
  Status read(const SourceTensor& t, void* out) const;
  // The bytes of one range (or a part of one) of tensor `name` into `out`.
  Status read(const SourceRange& range, const std::string& name, void* out) const;

 private:
  DeepSpeedCheckpoint() = default;

  std::string tagDir_, version_;
  int zeroStage_ = 0, worldSize_ = 0;
  std::vector<std::unique_ptr<ZipArchive>> archives_;
  std::vector<SourceTensor> tensors_;
  std::map<std::string, std::string> aliases_;
};

}  // namespace loom::convert
