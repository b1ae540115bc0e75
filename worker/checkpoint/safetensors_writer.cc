#include "worker/checkpoint/safetensors_writer.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"

namespace loom::checkpoint {

using nlohmann::json;

int64_t safetensorsElementBytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> kBytes{{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                     {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

int64_t SafetensorsEntry::bytes() const {
  int64_t n = safetensorsElementBytes(dtype);
  for (int64_t d : shape) n *= d;
  return n;
}

Status writeSafetensorsFile(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                            const std::vector<size_t>& indices, const BytesProducer& produce,
                            const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i : indices) {
    const SafetensorsEntry& e = entries[i];
    if (safetensorsElementBytes(e.dtype) == 0)
      return invalidArgument("{}: tensor {}: dtype {} cannot be stored in safetensors", path, e.name, e.dtype);
    const uint64_t bytes = static_cast<uint64_t>(e.bytes());
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string headerText = header.dump();
  headerText.append((8 - headerText.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const uint64_t headerSize = headerText.size();
  ASSIGN_OR_RETURN(auto writer, files::AtomicFileWriter::open(path));
  RETURN_IF_ERROR(writer->append(&headerSize, 8));
  RETURN_IF_ERROR(writer->append(headerText.data(), headerText.size()));
  for (size_t i : indices) {
    const SafetensorsEntry& e = entries[i];
    int64_t handed = 0;
    const ByteSink sink = [&](const void* data, size_t bytes) -> Status {
      handed += static_cast<int64_t>(bytes);
      if (handed > e.bytes())
        return internalError("{}: tensor {} came with more than its {} bytes", path, e.name, e.bytes());
      return writer->append(data, bytes);
    };
    RETURN_IF_ERROR(produce(i, sink));
    if (handed != e.bytes())
      return internalError("{}: tensor {} came with {} bytes, its header says {}", path, e.name, handed, e.bytes());
  }
  return writer->commit();
}

ShardPlan planShards(const std::vector<SafetensorsEntry>& entries, int64_t maxShardBytes) {
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].name < entries[b].name; });
  ShardPlan plan;
  plan.shards.emplace_back();
  int64_t shardBytes = 0;
  for (size_t i : order) {
    const int64_t bytes = entries[i].bytes();
    if (shardBytes > 0 && shardBytes + bytes > maxShardBytes) {
      plan.shards.emplace_back();
      shardBytes = 0;
    }
    plan.shards.back().push_back(i);
    shardBytes += bytes;
    plan.totalBytes += bytes;
  }
  const size_t n = plan.shards.size();
  for (size_t s = 0; s < n; ++s)
    plan.files.push_back(n == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n));
  return plan;
}

Status writeShard(const std::string& dir, const ShardPlan& plan, size_t s, const std::vector<SafetensorsEntry>& entries,
                  const BytesProducer& produce) {
  return writeSafetensorsFile(dir + "/" + plan.files[s], entries, plan.shards[s], produce, {{"format", "pt"}});
}

Status writeShardIndex(const std::string& dir, const ShardPlan& plan, const std::vector<SafetensorsEntry>& entries) {
  if (plan.shards.size() < 2) return Status::ok();
  json weightMap = json::object();
  for (size_t s = 0; s < plan.shards.size(); ++s)
    for (size_t i : plan.shards[s]) weightMap[entries[i].name] = plan.files[s];
  json index{{"metadata", {{"total_size", plan.totalBytes}}}, {"weight_map", weightMap}};
  return files::writeFileAtomic(dir + "/model.safetensors.index.json", index.dump(2));
}

StatusOr<std::vector<std::string>> writeSafetensorsModel(const std::string& dir,
                                                         const std::vector<SafetensorsEntry>& entries,
                                                         const BytesProducer& produce, int64_t maxShardBytes) {
  const ShardPlan plan = planShards(entries, maxShardBytes);
  RETURN_IF_ERROR(files::makeDirs(dir));
  for (size_t s = 0; s < plan.shards.size(); ++s) RETURN_IF_ERROR(writeShard(dir, plan, s, entries, produce));
  RETURN_IF_ERROR(writeShardIndex(dir, plan, entries));
  std::vector<std::string> names = plan.files;
  if (plan.shards.size() > 1) names.push_back("model.safetensors.index.json");
  return names;
}

}  // namespace loom::checkpoint
