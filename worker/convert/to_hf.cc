#include "worker/convert/to_hf.h"

#include <algorithm>

#include "worker/convert/dtype_cast.h"

namespace loom::worker {

namespace {

constexpr int64_t kChunkBytes = int64_t(64) << 20;

}  // namespace

HfWriter::HfWriter(const convert::CheckpointSource& source, const planner::ConvertSpec& spec) : source_(source) {
  for (const auto& t : source.tensors()) {
    const convert::StoredDtype* d = convert::storedDtype(t.dtype);
    if (!d) {
      status_ = invalidArgument("convert.from: tensor {} is {}, which safetensors does not hold", t.name, t.dtype);
      return;
    }
    storedAs_.push_back(d->safetensors);
    entries_.push_back({t.name, convert::outputDtype(*d, spec.dtype), t.shape});
    totalBytes_ += t.bytes();
    largest_ = std::max(largest_, t.bytes());
  }
  plan_ = checkpoint::planShards(entries_, spec.shardBytes);
}

int64_t HfWriter::shareBytes(int rank, int ranks) const {
  int64_t bytes = 0;
  for (size_t s = rank; s < plan_.shards.size(); s += ranks)
    for (size_t i : plan_.shards[s]) bytes += source_.tensors()[i].bytes();
  return bytes;
}

Status HfWriter::writeShare(const std::string& dir, int rank, int ranks, ConvertProgress& progress) {
  std::vector<char> in, out;
  const checkpoint::BytesProducer produce = [&](size_t i, const checkpoint::ByteSink& sink) -> Status {
    const convert::SourceTensor& t = source_.tensors()[i];
    const std::string& from = storedAs_[i];
    const std::string& to = entries_[i].dtype;
    const int64_t inElement = t.elementBytes, outElement = checkpoint::safetensorsElementBytes(to);
    // Whole elements per chunk, from each of the tensor's ranges in turn.
    const int64_t perChunk = std::max<int64_t>(1, kChunkBytes / std::max(inElement, outElement));
    for (const convert::SourceRange& range : t.ranges) {
      for (int64_t done = 0; done < range.bytes;) {
        const int64_t bytes = std::min(range.bytes - done, perChunk * inElement);
        in.resize(static_cast<size_t>(bytes));
        convert::SourceRange piece = range;
        piece.offset += done;
        piece.bytes = bytes;
        RETURN_IF_ERROR(source_.read(piece, t.name, in.data()));
        if (from == to) {
          RETURN_IF_ERROR(sink(in.data(), in.size()));
        } else {
          const int64_t count = bytes / inElement;
          out.resize(static_cast<size_t>(count * outElement));
          convert::castFloats(from, to, in.data(), out.data(), count);
          RETURN_IF_ERROR(sink(out.data(), out.size()));
        }
        done += bytes;
      }
    }
    progress.tensorDone(t.bytes());
    return Status::ok();
  };
  for (size_t s = rank; s < plan_.shards.size(); s += ranks)
    RETURN_IF_ERROR(checkpoint::writeShard(dir, plan_, s, entries_, produce).withContext("convert.output"));
  return Status::ok();
}

Status HfWriter::complete(const std::string& dir) const { return checkpoint::writeShardIndex(dir, plan_, entries_); }

}  // namespace loom::worker
