#include "worker/checkpoint/manifest.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cctype>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"

namespace loom::checkpoint {

using nlohmann::json;
namespace fs = std::filesystem;

StatusOr<uint32_t> crc32OfFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return notFound("{}: cannot open", path);
  std::vector<unsigned char> buffer(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  ssize_t n;
  while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) crc = crc32(crc, buffer.data(), static_cast<uInt>(n));
  ::close(fd);
  if (n < 0) return internalError("{}: read failed", path);
  return static_cast<uint32_t>(crc);
}

Status writeManifest(const std::string& dir, const std::string& tag) {
  json manifest{{"tag", tag}, {"files", json::object()}};
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name == "manifest.json") continue;
    ASSIGN_OR_RETURN(uint32_t crc, crc32OfFile(entry.path().string()));
    manifest["files"][name] = {{"bytes", entry.file_size()}, {"crc32", crc}};
  }
  return files::writeFileAtomic(dir + "/manifest.json", manifest.dump(2));
}

Status checkManifest(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, files::readFile(dir + "/manifest.json"));
  const json manifest = json::parse(text, nullptr, false);
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object())
    return Status(StatusCode::kDataLoss, fmt::format("{}/manifest.json: not a checkpoint manifest", dir));
  for (auto it = manifest["files"].begin(); it != manifest["files"].end(); ++it) {
    const std::string file = dir + "/" + it.key();
    const json& entry = it.value();
    if (!entry.is_object() || !entry.contains("bytes") || !entry.contains("crc32"))
      return Status(StatusCode::kDataLoss, fmt::format("{}/manifest.json: entry {} needs bytes and crc32", dir, it.key()));
    std::error_code ec;
    const auto bytes = fs::file_size(file, ec);
    if (ec) return Status(StatusCode::kDataLoss, fmt::format("{}: listed in the manifest but missing", file));
    if (bytes != entry["bytes"].get<uint64_t>())
      return Status(StatusCode::kDataLoss,
                    fmt::format("{}: {} bytes, the manifest says {}", file, bytes, entry["bytes"].get<uint64_t>()));
    ASSIGN_OR_RETURN(uint32_t crc, crc32OfFile(file));
    if (crc != entry["crc32"].get<uint32_t>())
      return Status(StatusCode::kDataLoss, fmt::format("{}: CRC-32 does not match the manifest: the file is corrupt", file));
  }
  return Status::ok();
}

StatusOr<std::string> readLatestTag(const std::string& checkpointDir) {
  const std::string latest = checkpointDir + "/latest";
  if (!files::exists(latest)) return notFound("{}: no `latest` file", checkpointDir);
  ASSIGN_OR_RETURN(std::string tag, files::readFile(latest));
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
  return tag;
}

}  // namespace loom::checkpoint
