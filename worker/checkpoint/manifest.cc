#include "worker/checkpoint/manifest.h"

#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"

namespace loom::checkpoint {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The CRC-32 of `bytes` bytes of `fd` from `offset`, read through a buffer of its own.
StatusOr<uLong> crc32OfRange(int fd, off_t offset, off_t bytes, const std::string& path) {
  std::vector<unsigned char> buffer(std::min<off_t>(bytes, off_t(4) << 20));
  uLong crc = crc32(0L, Z_NULL, 0);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, buffer.data(), std::min<off_t>(bytes, off_t(buffer.size())), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return internalError("{}: read at offset {} failed", path, offset);
    crc = crc32(crc, buffer.data(), static_cast<uInt>(n));
    offset += n;
    bytes -= n;
  }
  return crc;
}

}  // namespace

StatusOr<uint32_t> crc32OfFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return notFound("{}: cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return internalError("{}: stat failed", path);
  }
  // A checkpoint's files run to gigabytes, and one core's CRC-32 is slower than the page cache or
  // an NVMe disk: pieces of kPiece bytes go to up to 8 threads, and zlib combines their CRCs.
  constexpr off_t kPiece = off_t(64) << 20;
  const off_t size = st.st_size;
  const size_t pieces = static_cast<size_t>(std::max<off_t>(1, (size + kPiece - 1) / kPiece));
  const size_t threads = std::min<size_t>({pieces, 8, std::max(1u, std::thread::hardware_concurrency())});
  std::vector<StatusOr<uLong>> crcs(pieces, uLong(0));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < pieces; i = next++) {
      const off_t offset = static_cast<off_t>(i) * kPiece;
      crcs[i] = crc32OfRange(fd, offset, std::min(kPiece, size - offset), path);
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  ::close(fd);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t i = 0; i < pieces; ++i) {
    if (!crcs[i].isOk()) return crcs[i].status();
    const off_t offset = static_cast<off_t>(i) * kPiece;
    crc = crc32_combine(crc, *crcs[i], std::min(kPiece, size - offset));
  }
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

Status checkManifest(const std::string& dir, const std::vector<std::string>& only) {
  ASSIGN_OR_RETURN(std::string text, files::readFile(dir + "/manifest.json"));
  const json manifest = json::parse(text, nullptr, false);
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object())
    return Status(StatusCode::kDataLoss, fmt::format("{}/manifest.json: not a checkpoint manifest", dir));
  const json& listed = manifest["files"];
  for (const std::string& name : only) {
    if (!listed.contains(name))
      return Status(StatusCode::kDataLoss, fmt::format("{}/{}: not listed in the manifest", dir, name));
  }
  for (auto it = listed.begin(); it != listed.end(); ++it) {
    if (!only.empty() && std::find(only.begin(), only.end(), it.key()) == only.end()) continue;
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
