#include "worker/convert/to_hf.h"

#include <algorithm>

#include "worker/convert/chunk_copy.h"
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
  const checkpoint::BytesProducer produce = [&](size_t i, const checkpoint::ByteSink& sink) -> Status {
    const convert::SourceTensor& t = source_.tensors()[i];
    RETURN_IF_ERROR(convert::copyTensorAs(source_, t, entries_[i].dtype, kChunkBytes, sink));
    progress.tensorDone(t.bytes());
    return Status::ok();
  };
  for (size_t s = rank; s < plan_.shards.size(); s += ranks)
    RETURN_IF_ERROR(checkpoint::writeShard(dir, plan_, s, entries_, produce).withContext("convert.output"));
  return Status::ok();
}

Status HfWriter::complete(const std::string& dir) const { return checkpoint::writeShardIndex(dir, plan_, entries_); }

}  // namespace loom::worker
