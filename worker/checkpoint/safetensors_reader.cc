#include "worker/checkpoint/safetensors_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/shape.h"

namespace loom::checkpoint {

using nlohmann::json;

namespace {

// A header is a few MB even for a model of thousands of tensors; more is a corrupt length.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

Status preadAll(int fd, int64_t offset, int64_t bytes, void* out, const std::string& path) {
  auto* at = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, at, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return internalError("{}: read at offset {}: {}", path, offset, std::strerror(errno));
    if (n == 0) return Status(StatusCode::kDataLoss, fmt::format("{}: ends before offset {}", path, offset));
    at += n;
    offset += n;
    bytes -= n;
  }
  return Status::ok();
}

}  // namespace

int64_t StoredTensor::numel() const { return numelOf(entry.shape); }

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return notFound("{}: cannot open: {}", path, std::strerror(errno));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, fd));
  struct stat st{};
  if (::fstat(fd, &st) != 0) return internalError("{}: stat: {}", path, std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) return invalidArgument("{}: not a safetensors file (shorter than its header size)", path);
  uint64_t headerSize = 0;
  RETURN_IF_ERROR(preadAll(fd, 0, 8, &headerSize, path));
  if (headerSize > size - 8 || headerSize > kMaxHeaderBytes)
    return invalidArgument("{}: header size {} runs past the end of the file ({} bytes)", path, headerSize, size);
  std::string text(headerSize, '\0');
  RETURN_IF_ERROR(preadAll(fd, 8, static_cast<int64_t>(headerSize), text.data(), path));
  const json header = json::parse(text, nullptr, false);
  if (!header.is_object()) return invalidArgument("{}: the header is not a JSON object", path);
  const uint64_t dataStart = 8 + headerSize, dataSize = size - dataStart;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const json& e = it.value();
    auto bad = [&](const std::string& why) { return invalidArgument("{}: tensor {}: {}", path, name, why); };
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array())
      return bad("entry needs dtype, shape and data_offsets");
    StoredTensor t;
    t.entry.name = name;
    t.entry.dtype = e["dtype"].get<std::string>();
    const int64_t element = safetensorsElementBytes(t.entry.dtype);
    if (!element) return bad(fmt::format("dtype \"{}\" is not supported", t.entry.dtype));
    uint64_t numel = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 62) / std::max<uint64_t>(numel, 1))
        return bad(fmt::format("shape {} is not a list of sizes", e["shape"].dump()));
      numel *= d.get<uint64_t>();
      t.entry.shape.push_back(d.get<int64_t>());
    }
    const json& offsets = e["data_offsets"];
    const uint64_t bytes = numel * static_cast<uint64_t>(element);
    if (offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned() ||
        offsets[1].get<uint64_t>() < offsets[0].get<uint64_t>() || offsets[1].get<uint64_t>() > dataSize ||
        offsets[1].get<uint64_t>() - offsets[0].get<uint64_t>() != bytes)
      return bad(fmt::format("data_offsets {} do not hold {} bytes within the {} bytes of data", offsets.dump(), bytes,
                             dataSize));
    t.offset = static_cast<int64_t>(dataStart + offsets[0].get<uint64_t>());
    file->byName_[name] = file->tensors_.size();
    file->tensors_.push_back(std::move(t));
  }
  return file;
}

const StoredTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::read(int64_t offset, int64_t bytes, void* out) const {
  return preadAll(fd_, offset, bytes, out, path_);
}

StatusOr<std::vector<std::string>> modelFiles(const std::string& path) {
  if (!std::filesystem::is_directory(path)) return std::vector<std::string>{path};
  const std::string single = path + "/model.safetensors", index = path + "/model.safetensors.index.json";
  if (files::exists(single)) return std::vector<std::string>{single};
  if (!files::exists(index)) return notFound("{}: holds neither model.safetensors nor model.safetensors.index.json", path);
  ASSIGN_OR_RETURN(std::string text, files::readFile(index));
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return invalidArgument("{}: needs a weight_map object", index);
  std::set<std::string> shards;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) return invalidArgument("{}: weight_map.{} is not a file name", index, it.key());
    shards.insert(it.value().get<std::string>());
  }
  std::vector<std::string> out;
  for (const auto& shard : shards) out.push_back(path + "/" + shard);
  return out;
}

}  // namespace loom::checkpoint
