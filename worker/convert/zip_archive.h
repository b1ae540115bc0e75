#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/files.h"
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

// A zip archive written as torch.save writes one, member after member, each stored (not
// compressed) with its data 64-byte aligned (so that torch.load(mmap=True) maps tensors in place),
// ZIP64 where a size or an offset needs it. A member's bytes stream through once: its CRC-32 and
// size follow it in a data descriptor and the central directory, so no member is held whole. The
// file appears at `path` on finish() (through files::AtomicFileWriter), or not at all.
class ZipWriter {
 public:
  // `zip64From`: the size or offset from which a record is ZIP64 (4 GiB - 1, as the format needs;
  // lower in tests, to write the ZIP64 records of small files).
  static StatusOr<ZipWriter> create(const std::string& path, uint64_t zip64From = 0xffffffff);

  // Takes the next piece of a member's bytes.
  using Sink = std::function<Status(const void* data, size_t bytes)>;
  // Member `name` of exactly `size` bytes, which `write` hands to the sink it is given.
  Status add(const std::string& name, int64_t size, const std::function<Status(const Sink&)>& write);
  Status add(const std::string& name, const std::string& bytes);
  // The central directory; then the file is durable and in place.
  Status finish();

 private:
  struct Member {
    std::string name;
    int64_t headerOffset = 0, size = 0;
    uint32_t crc32 = 0;
  };
  ZipWriter() = default;
  Status append(const void* data, size_t bytes);
  Status appendLe(uint64_t value, int bytes);

  std::string path_;
  uint64_t zip64From_ = 0xffffffff;
  std::unique_ptr<files::AtomicFileWriter> file_;
  int64_t offset_ = 0;
  std::vector<Member> members_;
};

}  // namespace loom::convert
