#pragma once

#include <string>

#include "common/status.h"
#include "planner/job_spec.h"
#include "worker/checkpoint/safetensors_writer.h"
#include "worker/convert/checkpoint_source.h"
#include "worker/convert/convert_progress.h"
#include "worker/convert/convert_writer.h"

namespace loom::worker {

// A model directory in Hugging Face's safetensors layout from `source`: its tensors in name order,
// cut into shards of convert.shard_size (shard s written by rank s % ranks into `dir`), each
// tensor read, cast (convert.dtype) and written in chunks of at most 64 MiB. `complete` (rank 0,
// once every shard is there) writes the index.
class HfWriter : public ConvertWriter {
 public:
  HfWriter(const convert::CheckpointSource& source, const planner::ConvertSpec& spec);
  Status check() const { return status_; }
  int64_t totalBytes() const override { return totalBytes_; }
  int64_t largestTensorBytes() const override { return largest_; }
  size_t fileCount() const override { return plan_.files.size() + (plan_.files.size() > 1 ? 1 : 0); }
  // The bytes rank `rank` of `ranks` writes.
  int64_t shareBytes(int rank, int ranks) const override;

  Status writeShare(const std::string& dir, int rank, int ranks, ConvertProgress& progress) override;
  Status complete(const std::string& dir) const override;

 private:
  const convert::CheckpointSource& source_;
  Status status_;
  std::vector<checkpoint::SafetensorsEntry> entries_;
  checkpoint::ShardPlan plan_;
  int64_t totalBytes_ = 0, largest_ = 0;
};

}  // namespace loom::worker
