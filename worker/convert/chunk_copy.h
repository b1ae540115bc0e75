#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/checkpoint/safetensors_writer.h"
#include "worker/convert/checkpoint_source.h"

namespace loom::convert {

// The chunk a conversion copies state through: what it holds of any tensor at once.
constexpr int64_t kStateChunkBytes = int64_t(16) << 20;

// Bytes gathered from many small reads and handed to the sink a chunk at a time, in `data` (of
// kStateChunkBytes, allocated once for all the tensors of a file: most are far smaller).
class ChunkBuffer {
 public:
  ChunkBuffer(std::vector<char>& data, const checkpoint::ByteSink& sink) : sink_(sink), data_(data) {}
  // Room for at least one element; the caller writes up to room() bytes at free() and commits.
  StatusOr<char*> free();
  int64_t room() const { return static_cast<int64_t>(data_.size()) - used_; }
  void commit(int64_t bytes) { used_ += bytes; }
  Status zeros(int64_t bytes);
  Status flush();

 private:
  const checkpoint::ByteSink& sink_;
  std::vector<char>& data_;
  int64_t used_ = 0;
};

// The first element of each of a state's fp32 ranges: where copyWhole finds an element.
std::vector<int64_t> rangeStarts(const std::vector<SourceRange>& ranges);

// Elements [whole, whole + length) of one parameter's fp32 state from the source's ranges
// (`starts`: rangeStarts of them) into `buffer`, range by range; `name` for errors.
Status copyWhole(const CheckpointSource& source, const std::vector<SourceRange>& ranges,
                 const std::vector<int64_t>& starts, int64_t whole, int64_t length, const std::string& name,
                 ChunkBuffer& buffer);

// Tensor `t` of the model in safetensors dtype `to` (its own, or F32 / BF16 for a floating one),
// read and cast at most `chunkBytes` of it at a time, into `sink`.
Status copyTensorAs(const CheckpointSource& source, const SourceTensor& t, const std::string& to, int64_t chunkBytes,
                    const checkpoint::ByteSink& sink);

}  // namespace loom::convert
