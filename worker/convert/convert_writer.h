#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "worker/convert/convert_progress.h"

namespace loom::worker {

// What a convert job writes (convert.to): HF safetensors, a Loom checkpoint, a DeepSpeed
// universal checkpoint. Its files are split over the job's ranks; each rank writes its share into
// the output's temporary directory, then rank 0 completes it (an index, a manifest, a latest
// file) once every share is there.
class ConvertWriter {
 public:
  virtual ~ConvertWriter() = default;
  virtual int64_t totalBytes() const = 0;
  // The largest tensor: what a copy through chunks never holds whole.
  virtual int64_t largestTensorBytes() const = 0;
  virtual size_t fileCount() const = 0;
  // The bytes rank `rank` of `ranks` writes.
  virtual int64_t shareBytes(int rank, int ranks) const = 0;

  virtual Status writeShare(const std::string& dir, int rank, int ranks, ConvertProgress& progress) = 0;
  virtual Status complete(const std::string& dir) const = 0;
};

}  // namespace loom::worker
