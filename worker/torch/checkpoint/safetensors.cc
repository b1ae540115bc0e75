#include "worker/torch/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "worker/checkpoint/safetensors_writer.h"

namespace loom::worker {

using nlohmann::json;

namespace {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool},
};

StatusOr<at::ScalarType> dtypeFromName(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  return invalidArgument("dtype \"{}\" is not supported", name);
}

StatusOr<const char*> nameFromDtype(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return d.name;
  }
  return invalidArgument("dtype {} cannot be stored in safetensors", c10::toString(type));
}

// A read-only mapping of a whole file, unmapped when it goes out of scope.
class MappedFile {
 public:
  static StatusOr<std::unique_ptr<MappedFile>> open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return notFound("{}: cannot open: {}", path, std::strerror(errno));
    struct stat st{};
    ::fstat(fd, &st);
    void* data = st.st_size ? ::mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    ::close(fd);
    if (data == MAP_FAILED) return internalError("{}: mmap: {}", path, std::strerror(errno));
    return std::unique_ptr<MappedFile>(new MappedFile(static_cast<const char*>(data), st.st_size));
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(const char* data, size_t size) : data_(data), size_(size) {}
  const char* data_;
  size_t size_;
};

Status loadFile(const std::string& path, TensorMap* out) {
  ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  if (file->size() < 8) return invalidArgument("{}: not a safetensors file (shorter than its header size)", path);
  uint64_t headerSize = 0;
  std::memcpy(&headerSize, file->data(), 8);
  if (headerSize > file->size() - 8)
    return invalidArgument("{}: header size {} runs past the end of the file ({} bytes)", path, headerSize,
                           file->size());
  json header = json::parse(std::string_view(file->data() + 8, headerSize), nullptr, false);
  if (!header.is_object()) return invalidArgument("{}: the header is not a JSON object", path);
  const char* data = file->data() + 8 + headerSize;
  const uint64_t dataSize = file->size() - 8 - headerSize;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const json& entry = it.value();
    auto bad = [&](const std::string& why) { return invalidArgument("{}: tensor {}: {}", path, name, why); };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      return bad("entry needs dtype, shape and data_offsets");
    auto dtype = dtypeFromName(entry["dtype"].get<std::string>());
    if (!dtype.isOk()) return bad(dtype.status().message());
    std::vector<int64_t> shape = entry["shape"].get<std::vector<int64_t>>();
    auto offsets = entry["data_offsets"].get<std::vector<uint64_t>>();
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const uint64_t bytes = static_cast<uint64_t>(numel) * c10::elementSize(*dtype);
    if (offsets.size() != 2 || offsets[1] < offsets[0] || offsets[1] > dataSize || offsets[1] - offsets[0] != bytes)
      return bad(fmt::format("data_offsets {} do not hold {} bytes within the {} bytes of data", entry["data_offsets"].dump(),
                             bytes, dataSize));
    // Copied out of the mapping: the file may be replaced while the tensors live on.
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(*dtype));
    if (bytes) std::memcpy(t.data_ptr(), data + offsets[0], bytes);
    (*out)[name] = std::move(t);
  }
  return Status::ok();
}

}  // namespace

StatusOr<TensorMap> loadSafetensors(const std::string& path) {
  TensorMap tensors;
  if (!std::filesystem::is_directory(path)) {
    RETURN_IF_ERROR(loadFile(path, &tensors));
    return tensors;
  }
  const std::string single = path + "/model.safetensors", index = path + "/model.safetensors.index.json";
  if (files::exists(single)) {
    RETURN_IF_ERROR(loadFile(single, &tensors));
    return tensors;
  }
  if (!files::exists(index))
    return notFound("{}: holds neither model.safetensors nor model.safetensors.index.json", path);
  ASSIGN_OR_RETURN(std::string text, files::readFile(index));
  json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return invalidArgument("{}: needs a weight_map object", index);
  std::set<std::string> shards;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) shards.insert(it.value().get<std::string>());
  for (const auto& shard : shards) RETURN_IF_ERROR(loadFile(path + "/" + shard, &tensors));
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!tensors.count(it.key()))
      return invalidArgument("{}: tensor {} is mapped to {} but that file does not hold it", index, it.key(),
                             it.value().get<std::string>());
  }
  return tensors;
}

namespace {

// The torch-free writer's view of the entries, and their bytes from the tensors `produce` hands
// over (checked against their entries: dtype and shape).
StatusOr<std::vector<checkpoint::SafetensorsEntry>> bytesEntries(const std::vector<TensorEntry>& entries) {
  std::vector<checkpoint::SafetensorsEntry> out;
  for (const TensorEntry& e : entries) {
    auto dtype = nameFromDtype(e.dtype);
    if (!dtype.isOk()) return dtype.status().withContext("tensor " + e.name);
    out.push_back({e.name, *dtype, e.shape});
  }
  return out;
}

checkpoint::BytesProducer bytesOf(const std::string& where, const std::vector<TensorEntry>& entries,
                                  const TensorProducer& produce) {
  return [&where, &entries, &produce](size_t i, const checkpoint::ByteSink& sink) -> Status {
    const TensorEntry& e = entries[i];
    ASSIGN_OR_RETURN(at::Tensor produced, produce(i));
    at::Tensor t = produced.detach().to(at::kCPU).contiguous();
    if (t.scalar_type() != e.dtype || t.sizes().vec() != e.shape)
      return internalError("{}: tensor {} came as {} {}, its header says {} {}", where, e.name,
                           c10::toString(t.scalar_type()), c10::str(t.sizes()), c10::toString(e.dtype),
                           c10::str(at::IntArrayRef(e.shape)));
    return sink(t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
  };
}

Status streamSafetensorsFile(const std::string& path, const std::vector<TensorEntry>& entries,
                             const std::vector<size_t>& indices, const TensorProducer& produce,
                             const std::map<std::string, std::string>& metadata) {
  auto bytesEntriesOf = bytesEntries(entries);
  if (!bytesEntriesOf.isOk()) return bytesEntriesOf.status().withContext(path);
  return checkpoint::writeSafetensorsFile(path, *bytesEntriesOf, indices, bytesOf(path, entries, produce), metadata);
}

std::vector<TensorEntry> entriesOf(const TensorMap& tensors) {
  std::vector<TensorEntry> out;
  for (const auto& [name, t] : tensors) out.push_back({name, t.scalar_type(), t.sizes().vec()});
  return out;
}

TensorProducer producerOf(const TensorMap& tensors, const std::vector<TensorEntry>& entries) {
  return [&tensors, &entries](size_t i) -> StatusOr<at::Tensor> { return tensors.at(entries[i].name); };
}

}  // namespace

Status saveSafetensorsFile(const std::string& path, const TensorMap& tensors,
                           const std::map<std::string, std::string>& metadata) {
  const std::vector<TensorEntry> entries = entriesOf(tensors);
  std::vector<size_t> all(entries.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return streamSafetensorsFile(path, entries, all, producerOf(tensors, entries), metadata);
}

StatusOr<std::vector<std::string>> saveSafetensorsModel(const std::string& dir, const TensorMap& tensors,
                                                        int64_t maxShardBytes) {
  const std::vector<TensorEntry> entries = entriesOf(tensors);
  return streamSafetensorsModel(dir, entries, producerOf(tensors, entries), /*write=*/true, maxShardBytes);
}

StatusOr<std::vector<std::string>> streamSafetensorsModel(const std::string& dir, std::vector<TensorEntry> entries,
                                                          const TensorProducer& produce, bool write,
                                                          int64_t maxShardBytes) {
  // Name order, as a safetensors file lists its tensors; `produce` is asked in that order.
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].name < entries[b].name; });
  if (!write) {
    for (size_t i : order) RETURN_IF_ERROR(produce(i).status());
    return std::vector<std::string>{};
  }
  // A write that fails part way still asks for the tensors it did not reach: the other ranks
  // gather each of them with this one, and would wait for it in the next gather.
  std::vector<bool> produced(entries.size(), false);
  const TensorProducer tracked = [&](size_t i) {
    produced[i] = true;
    return produce(i);
  };
  StatusOr<std::vector<std::string>> written = [&]() -> StatusOr<std::vector<std::string>> {
    ASSIGN_OR_RETURN(auto bytesEntriesOf, bytesEntries(entries));
    return checkpoint::writeSafetensorsModel(dir, bytesEntriesOf, bytesOf(dir, entries, tracked), maxShardBytes);
  }();
  if (!written.isOk()) {
    for (size_t i : order)
      if (!produced[i]) (void)produce(i);
  }
  return written;
}

}  // namespace loom::worker
