#include "worker/convert/chunk_copy.h"

#include <algorithm>

#include "worker/convert/dtype_cast.h"

namespace loom::convert {

namespace {

constexpr int64_t kF32 = 4;

}  // namespace

StatusOr<char*> ChunkBuffer::free() {
  if (used_ == static_cast<int64_t>(data_.size())) RETURN_IF_ERROR(flush());
  return data_.data() + used_;
}

Status ChunkBuffer::zeros(int64_t bytes) {
  while (bytes > 0) {
    ASSIGN_OR_RETURN(char* at, free());
    const int64_t n = std::min(bytes, room());
    std::fill(at, at + n, 0);
    commit(n);
    bytes -= n;
  }
  return Status::ok();
}

Status ChunkBuffer::flush() {
  if (used_) RETURN_IF_ERROR(sink_(data_.data(), static_cast<size_t>(used_)));
  used_ = 0;
  return Status::ok();
}

std::vector<int64_t> rangeStarts(const std::vector<SourceRange>& ranges) {
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (const SourceRange& r : ranges) {
    starts.push_back(at);
    at += r.bytes / kF32;
  }
  return starts;
}

Status copyWhole(const CheckpointSource& source, const std::vector<SourceRange>& ranges,
                 const std::vector<int64_t>& starts, int64_t whole, int64_t length, const std::string& name,
                 ChunkBuffer& buffer) {
  size_t r = std::upper_bound(starts.begin(), starts.end(), whole) - starts.begin() - 1;
  while (length > 0) {
    const SourceRange& range = ranges[r];
    const int64_t within = whole - starts[r];
    const int64_t inRange = range.bytes / kF32 - within;
    if (inRange <= 0) {
      ++r;
      continue;
    }
    ASSIGN_OR_RETURN(char* at, buffer.free());
    const int64_t n = std::min({length, inRange, buffer.room() / kF32});
    SourceRange piece = range;
    piece.offset += within * kF32;
    piece.bytes = n * kF32;
    RETURN_IF_ERROR(source.read(piece, name, at));
    buffer.commit(n * kF32);
    whole += n;
    length -= n;
  }
  return Status::ok();
}

Status copyTensorAs(const CheckpointSource& source, const SourceTensor& t, const std::string& to, int64_t chunkBytes,
                    const checkpoint::ByteSink& sink) {
  const StoredDtype* stored = storedDtype(t.dtype);
  if (!stored) return invalidArgument("convert.from: tensor {} is {}, which safetensors does not hold", t.name, t.dtype);
  const std::string from = stored->safetensors;
  const int64_t inElement = t.elementBytes, outElement = checkpoint::safetensorsElementBytes(to);
  // Whole elements per chunk, from each of the tensor's ranges in turn.
  const int64_t perChunk = std::max<int64_t>(1, chunkBytes / std::max(inElement, outElement));
  std::vector<char> in, out;
  for (const SourceRange& range : t.ranges) {
    for (int64_t done = 0; done < range.bytes;) {
      const int64_t bytes = std::min(range.bytes - done, perChunk * inElement);
      in.resize(static_cast<size_t>(bytes));
      SourceRange piece = range;
      piece.offset += done;
      piece.bytes = bytes;
      RETURN_IF_ERROR(source.read(piece, t.name, in.data()));
      if (from == to) {
        RETURN_IF_ERROR(sink(in.data(), in.size()));
      } else {
        const int64_t count = bytes / inElement;
        out.resize(static_cast<size_t>(count * outElement));
        castFloats(from, to, in.data(), out.data(), count);
        RETURN_IF_ERROR(sink(out.data(), out.size()));
      }
      done += bytes;
    }
  }
  return Status::ok();
}

}  // namespace loom::convert
