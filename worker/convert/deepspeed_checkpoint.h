#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/convert/checkpoint_source.h"
#include "worker/convert/torch_pickle.h"
#include "worker/convert/zip_archive.h"

namespace loom::convert {

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
class DeepSpeedCheckpoint : public CheckpointSource {
 public:
  // `dir`: the checkpoint directory (its `latest` names the tag) or a tag directory.
  static StatusOr<std::unique_ptr<DeepSpeedCheckpoint>> open(const std::string& dir);

  const std::string& tagDir() const { return tagDir_; }
  int zeroStage() const { return zeroStage_; }
  int worldSize() const { return worldSize_; }
  const std::string& deepspeedVersion() const { return version_; }
  const std::vector<SourceTensor>& tensors() const override { return tensors_; }
  std::string describe() const override;
  size_t tiedCount() const override { return aliases_.size(); }
  // Tied names: the name not stored -> the stored one (lm_head.weight -> model.embed_tokens.weight).
  const std::map<std::string, std::string>& aliases() const { return aliases_; }

  // The tensor's bytes (t.bytes() of them) into `out`.
  Status read(const SourceTensor& t, void* out) const;
  // The bytes of one range (or a part of one) of tensor `name` into `out`.
  Status read(const SourceRange& range, const std::string& name, void* out) const override;

 private:
  DeepSpeedCheckpoint() = default;

  std::string tagDir_, version_;
  int zeroStage_ = 0, worldSize_ = 0;
  std::vector<std::unique_ptr<ZipArchive>> archives_;
  std::vector<SourceTensor> tensors_;
  std::map<std::string, std::string> aliases_;
};

}  // namespace loom::convert
