#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::convert {

// One member of a zip archive: where its bytes lie in the file.
struct ZipEntry {
  std::string name;
  int64_t offset = 0;  // of the first data byte, in the file
  int64_t size = 0;
  uint32_t crc32 = 0;
};

// A zip archive as torch.save writes it (PyTorch's zip serialization): members stored without
// compression, ZIP64 where sizes or offsets need it. Read with pread, never mapped, so that
// reading a member holds only the bytes asked for. Every structure is bounds-checked against the
// file: a truncated or corrupted archive is INVALID_ARGUMENT naming the file, the offset and
// what was wrong there. A compressed member is refused by name.
class ZipArchive {
 public:
  static StatusOr<ZipArchive> open(const std::string& path);

  ZipArchive(ZipArchive&& other) noexcept;
  ZipArchive& operator=(ZipArchive&& other) noexcept;
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;
  ~ZipArchive();

  const std::string& path() const { return path_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // The member named `name`, or the one whose name ends with "/" + `name` (torch.save puts every
  // member under one top folder named after the file); null when there is none.
  const ZipEntry* find(const std::string& suffix) const;
  // `size` bytes of `entry` from `offset` within it.
  Status read(const ZipEntry& entry, int64_t offset, int64_t size, void* out) const;
  // The whole member, its CRC-32 checked: for the small ones (the pickle, the version).
  StatusOr<std::string> readAll(const ZipEntry& entry) const;

 private:
  ZipArchive() = default;

  std::string path_;
  int fd_ = -1;
  int64_t fileSize_ = 0;
  std::vector<ZipEntry> entries_;
};

}  // namespace loom::convert
