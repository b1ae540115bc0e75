#include "worker/convert/zip_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <zlib.h>

namespace loom::convert {

namespace {

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr int64_t kEndOfDirectoryBytes = 22, kLocatorBytes = 20, kZip64EndBytes = 56;
constexpr int64_t kDirectoryEntryBytes = 46, kLocalHeaderBytes = 30;
constexpr uint16_t kZip64Extra = 0x0001;
constexpr uint32_t kDataDescriptor = 0x08074b50;
constexpr uint16_t kPaddingExtra = 0x4246;  // what PyTorch's writer pads with, so a reader skips it
constexpr uint16_t kFollowedByDescriptor = 0x0008;
constexpr uint16_t kDosDate1980 = (0 << 9) | (1 << 5) | 1;  // 1980-01-01: every member the same date
constexpr uint64_t kNeeds64 = 0xffffffff;
constexpr int64_t kDataAlignment = 64;

// Little-endian fields of a byte buffer, every read checked against its end.
class Fields {
 public:
  Fields(const std::string& bytes, int64_t fileOffset) : bytes_(bytes), base_(fileOffset) {}
  bool has(size_t at, size_t n) const { return at <= bytes_.size() && n <= bytes_.size() - at; }
  uint64_t le(size_t at, int n) const {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes_[at + i]);
    return v;
  }
  int64_t fileOffset(size_t at) const { return base_ + static_cast<int64_t>(at); }

 private:
  const std::string& bytes_;
  int64_t base_;
};

Status readAt(int fd, const std::string& path, int64_t offset, int64_t size, void* out) {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, static_cast<size_t>(size), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return invalidArgument("{}: cannot read at offset {}: {}", path, offset, std::strerror(errno));
    if (n == 0) return invalidArgument("{}: truncated: the file ends before offset {}", path, offset);
    p += n, offset += n, size -= n;
  }
  return Status::ok();
}

StatusOr<std::string> readString(int fd, const std::string& path, int64_t offset, int64_t size) {
  std::string out(static_cast<size_t>(size), '\0');
  RETURN_IF_ERROR(readAt(fd, path, offset, size, out.data()));
  return out;
}

}  // namespace

ZipArchive::ZipArchive(ZipArchive&& other) noexcept { *this = std::move(other); }

ZipArchive& ZipArchive::operator=(ZipArchive&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    fileSize_ = other.fileSize_;
    entries_ = std::move(other.entries_);
    other.fd_ = -1;
  }
  return *this;
}

ZipArchive::~ZipArchive() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<ZipArchive> ZipArchive::open(const std::string& path) {
  ZipArchive zip;
  zip.path_ = path;
  zip.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (zip.fd_ < 0) return notFound("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st{};
  if (::fstat(zip.fd_, &st) != 0) return invalidArgument("{}: cannot stat: {}", path, std::strerror(errno));
  zip.fileSize_ = st.st_size;
  if (zip.fileSize_ < kEndOfDirectoryBytes)
    return invalidArgument("{}: not a zip archive (torch.save's format): {} bytes is shorter than its end record", path,
                           zip.fileSize_);

  // The end-of-directory record, searched back from the end over its comment's longest reach.
  const int64_t tailSize = std::min<int64_t>(zip.fileSize_, kEndOfDirectoryBytes + 0xffff);
  const int64_t tailStart = zip.fileSize_ - tailSize;
  ASSIGN_OR_RETURN(const std::string tail, readString(zip.fd_, path, tailStart, tailSize));
  Fields t(tail, tailStart);
  int64_t end = -1;
  for (int64_t at = tailSize - kEndOfDirectoryBytes; at >= 0; --at) {
    if (t.le(at, 4) == kEndOfDirectory) {
      end = at;
      break;
    }
  }
  if (end < 0)
    return invalidArgument("{}: truncated, or not a zip archive (torch.save's format): no end-of-directory record at "
                           "offsets {} to {}, the end of the file",
                           path, tailStart, zip.fileSize_);
  uint64_t count = t.le(end + 10, 2), directorySize = t.le(end + 12, 4), directoryOffset = t.le(end + 16, 4);
  if (count == 0xffff || directorySize == 0xffffffff || directoryOffset == 0xffffffff) {
    // ZIP64: the locator just before the record points at the 64-bit end record.
    if (end < kLocatorBytes || t.le(end - kLocatorBytes, 4) != kZip64Locator)
      return invalidArgument("{}: offset {}: a ZIP64 archive without its ZIP64 locator", path, t.fileOffset(end));
    const int64_t recordOffset = static_cast<int64_t>(t.le(end - kLocatorBytes + 8, 8));
    if (recordOffset < 0 || recordOffset > zip.fileSize_ - kZip64EndBytes)
      return invalidArgument("{}: offset {}: the ZIP64 end record's offset {} lies outside the file", path,
                             t.fileOffset(end - kLocatorBytes), recordOffset);
    ASSIGN_OR_RETURN(const std::string record, readString(zip.fd_, path, recordOffset, kZip64EndBytes));
    Fields r(record, recordOffset);
    if (r.le(0, 4) != kZip64EndOfDirectory)
      return invalidArgument("{}: offset {}: no ZIP64 end-of-directory record there", path, recordOffset);
    count = r.le(32, 8), directorySize = r.le(40, 8), directoryOffset = r.le(48, 8);
  }
  if (directoryOffset > static_cast<uint64_t>(zip.fileSize_) ||
      directorySize > static_cast<uint64_t>(zip.fileSize_) - directoryOffset)
    return invalidArgument("{}: offset {}: the central directory ({} bytes at {}) lies outside the file of {} bytes",
                           path, t.fileOffset(end), directorySize, directoryOffset, zip.fileSize_);
  if (count > directorySize / kDirectoryEntryBytes)
    return invalidArgument("{}: offset {}: {} entries cannot fit a central directory of {} bytes", path,
                           t.fileOffset(end), count, directorySize);

  ASSIGN_OR_RETURN(const std::string directory, readString(zip.fd_, path, static_cast<int64_t>(directoryOffset),
                                                           static_cast<int64_t>(directorySize)));
  Fields d(directory, static_cast<int64_t>(directoryOffset));
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (!d.has(at, kDirectoryEntryBytes) || d.le(at, 4) != kDirectoryEntry)
      return invalidArgument("{}: offset {}: central directory entry {} is corrupt (no entry signature)", path,
                             d.fileOffset(at), i);
    const uint64_t method = d.le(at + 10, 2), crc = d.le(at + 16, 4);
    uint64_t compressed = d.le(at + 20, 4), size = d.le(at + 24, 4), local = d.le(at + 42, 4);
    const size_t nameLen = d.le(at + 28, 2), extraLen = d.le(at + 30, 2), commentLen = d.le(at + 32, 2);
    if (!d.has(at + kDirectoryEntryBytes, nameLen + extraLen + commentLen))
      return invalidArgument("{}: offset {}: central directory entry {} runs past the directory", path,
                             d.fileOffset(at), i);
    ZipEntry entry{.name = directory.substr(at + kDirectoryEntryBytes, nameLen)};
    // ZIP64 sizes and offset, in this order, for the fields that overflowed.
    size_t extra = at + kDirectoryEntryBytes + nameLen;
    const size_t extraEnd = extra + extraLen;
    while (extra + 4 <= extraEnd) {
      const uint64_t id = d.le(extra, 2), length = d.le(extra + 2, 2);
      if (extra + 4 + length > extraEnd)
        return invalidArgument("{}: offset {}: member {}: an extra field runs past its entry", path,
                               d.fileOffset(extra), entry.name);
      if (id == kZip64Extra) {
        size_t field = extra + 4;
        auto widen = [&](uint64_t& value) -> Status {
          if (value != 0xffffffff) return Status::ok();
          if (field + 8 > extra + 4 + length)
            return invalidArgument("{}: offset {}: member {}: its ZIP64 field is too short", path,
                                   d.fileOffset(field), entry.name);
          value = d.le(field, 8);
          field += 8;
          return Status::ok();
        };
        RETURN_IF_ERROR(widen(size));
        RETURN_IF_ERROR(widen(compressed));
        RETURN_IF_ERROR(widen(local));
      }
      extra += 4 + length;
    }
    if (method != 0)
      return invalidArgument("{}: member {} is compressed (method {}); torch.save stores members uncompressed", path,
                             entry.name, method);
    if (compressed != size)
      return invalidArgument("{}: member {}: stored with {} bytes but {} uncompressed", path, entry.name, compressed,
                             size);
    if (local > static_cast<uint64_t>(zip.fileSize_) - kLocalHeaderBytes)
      return invalidArgument("{}: member {}: its local header offset {} lies outside the file", path, entry.name,
                             local);
    ASSIGN_OR_RETURN(const std::string header,
                     readString(zip.fd_, path, static_cast<int64_t>(local), kLocalHeaderBytes));
    Fields h(header, static_cast<int64_t>(local));
    if (h.le(0, 4) != kLocalHeader)
      return invalidArgument("{}: offset {}: member {}: no local header there", path, local, entry.name);
    const uint64_t dataOffset = local + kLocalHeaderBytes + h.le(26, 2) + h.le(28, 2);
    if (dataOffset > static_cast<uint64_t>(zip.fileSize_) || size > static_cast<uint64_t>(zip.fileSize_) - dataOffset)
      return invalidArgument("{}: member {}: truncated: its {} bytes at offset {} run past the end of the file ({} "
                             "bytes)",
                             path, entry.name, size, dataOffset, zip.fileSize_);
    entry.offset = static_cast<int64_t>(dataOffset);
    entry.size = static_cast<int64_t>(size);
    entry.crc32 = static_cast<uint32_t>(crc);
    zip.entries_.push_back(std::move(entry));
    at += kDirectoryEntryBytes + nameLen + extraLen + commentLen;
  }
  return zip;
}

const ZipEntry* ZipArchive::find(const std::string& suffix) const {
  for (const ZipEntry& e : entries_) {
    if (e.name == suffix) return &e;
    if (e.name.size() > suffix.size() && e.name.compare(e.name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        e.name[e.name.size() - suffix.size() - 1] == '/' &&
        e.name.find('/') == e.name.size() - suffix.size() - 1)
      return &e;
  }
  return nullptr;
}

Status ZipArchive::read(const ZipEntry& entry, int64_t offset, int64_t size, void* out) const {
  if (offset < 0 || size < 0 || offset > entry.size || size > entry.size - offset)
    return invalidArgument("{}: member {}: bytes [{}, {}) lie outside its {} bytes", path_, entry.name, offset,
                           offset + size, entry.size);
  return readAt(fd_, path_, entry.offset + offset, size, out);
}

StatusOr<std::string> ZipArchive::readAll(const ZipEntry& entry) const {
  std::string out(static_cast<size_t>(entry.size), '\0');
  RETURN_IF_ERROR(read(entry, 0, entry.size, out.data()));
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(out.data()), static_cast<uInt>(out.size()));
  if (static_cast<uint32_t>(crc) != entry.crc32)
    return invalidArgument("{}: member {} (offset {}) is corrupt: CRC-32 {:08x}, the directory says {:08x}", path_,
                           entry.name, entry.offset, static_cast<uint32_t>(crc), entry.crc32);
  return out;
}

StatusOr<ZipWriter> ZipWriter::create(const std::string& path, uint64_t zip64From) {
  ZipWriter zip;
  zip.path_ = path;
  zip.zip64From_ = std::min<uint64_t>(zip64From, kNeeds64);
  ASSIGN_OR_RETURN(zip.file_, files::AtomicFileWriter::open(path));
  return zip;
}

Status ZipWriter::append(const void* data, size_t bytes) {
  RETURN_IF_ERROR(file_->append(data, bytes));
  offset_ += static_cast<int64_t>(bytes);
  return Status::ok();
}

Status ZipWriter::appendLe(uint64_t value, int bytes) {
  unsigned char le[8];
  for (int i = 0; i < bytes; ++i) le[i] = static_cast<unsigned char>(value >> (8 * i));
  return append(le, static_cast<size_t>(bytes));
}

Status ZipWriter::add(const std::string& name, const std::string& bytes) {
  return add(name, static_cast<int64_t>(bytes.size()), [&](const Sink& sink) { return sink(bytes.data(), bytes.size()); });
}

Status ZipWriter::add(const std::string& name, int64_t size, const std::function<Status(const Sink&)>& write) {
  if (name.size() > 0xffff) return invalidArgument("{}: member name of {} bytes is too long for zip", path_, name.size());
  Member member{.name = name, .headerOffset = offset_, .size = size};
  const bool zip64 = static_cast<uint64_t>(size) >= zip64From_;
  // The local header: its CRC-32 and sizes come after the data (the descriptor), ZIP64's sizes
  // as 0 until then; padding in the extra field puts the data on a 64-byte boundary.
  const int64_t zip64Bytes = zip64 ? 20 : 0;
  const int64_t unpadded = offset_ + kLocalHeaderBytes + static_cast<int64_t>(name.size()) + zip64Bytes + 4;
  const int64_t padding = (kDataAlignment - unpadded % kDataAlignment) % kDataAlignment;
  RETURN_IF_ERROR(appendLe(kLocalHeader, 4));
  RETURN_IF_ERROR(appendLe(zip64 ? 45 : 20, 2));
  RETURN_IF_ERROR(appendLe(kFollowedByDescriptor, 2));
  RETURN_IF_ERROR(appendLe(0, 2));  // stored
  RETURN_IF_ERROR(appendLe(0, 2));
  RETURN_IF_ERROR(appendLe(kDosDate1980, 2));
  RETURN_IF_ERROR(appendLe(0, 4));
  RETURN_IF_ERROR(appendLe(zip64 ? kNeeds64 : 0, 4));
  RETURN_IF_ERROR(appendLe(zip64 ? kNeeds64 : 0, 4));
  RETURN_IF_ERROR(appendLe(name.size(), 2));
  RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(zip64Bytes + 4 + padding), 2));
  RETURN_IF_ERROR(append(name.data(), name.size()));
  if (zip64) {
    RETURN_IF_ERROR(appendLe(kZip64Extra, 2));
    RETURN_IF_ERROR(appendLe(16, 2));
    RETURN_IF_ERROR(appendLe(0, 8));
    RETURN_IF_ERROR(appendLe(0, 8));
  }
  RETURN_IF_ERROR(appendLe(kPaddingExtra, 2));
  RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(padding), 2));
  RETURN_IF_ERROR(append(std::string(static_cast<size_t>(padding), '\0').data(), static_cast<size_t>(padding)));

  uLong crc = crc32(0L, Z_NULL, 0);
  int64_t written = 0;
  RETURN_IF_ERROR(write([&](const void* data, size_t bytes) -> Status {
    if (written + static_cast<int64_t>(bytes) > size)
      return internalError("{}: member {}: more than the {} bytes it was added with", path_, name, size);
    // crc32 takes at most 4 GiB at a time.
    for (size_t done = 0; done < bytes;) {
      const size_t n = std::min<size_t>(bytes - done, size_t(1) << 30);
      crc = crc32(crc, static_cast<const Bytef*>(data) + done, static_cast<uInt>(n));
      done += n;
    }
    written += static_cast<int64_t>(bytes);
    return append(data, bytes);
  }));
  if (written != size)
    return internalError("{}: member {}: {} bytes written, {} expected", path_, name, written, size);
  member.crc32 = static_cast<uint32_t>(crc);
  RETURN_IF_ERROR(appendLe(kDataDescriptor, 4));
  RETURN_IF_ERROR(appendLe(member.crc32, 4));
  RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(size), zip64 ? 8 : 4));
  RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(size), zip64 ? 8 : 4));
  members_.push_back(std::move(member));
  return Status::ok();
}

Status ZipWriter::finish() {
  const int64_t directoryOffset = offset_;
  for (const Member& m : members_) {
    const bool bigSize = static_cast<uint64_t>(m.size) >= zip64From_;
    const bool bigOffset = static_cast<uint64_t>(m.headerOffset) >= zip64From_;
    const int extra = (bigSize ? 16 : 0) + (bigOffset ? 8 : 0);
    RETURN_IF_ERROR(appendLe(kDirectoryEntry, 4));
    RETURN_IF_ERROR(appendLe(extra ? 45 : 20, 2));  // made by
    RETURN_IF_ERROR(appendLe(extra ? 45 : 20, 2));  // needed
    RETURN_IF_ERROR(appendLe(kFollowedByDescriptor, 2));
    RETURN_IF_ERROR(appendLe(0, 2));
    RETURN_IF_ERROR(appendLe(0, 2));
    RETURN_IF_ERROR(appendLe(kDosDate1980, 2));
    RETURN_IF_ERROR(appendLe(m.crc32, 4));
    RETURN_IF_ERROR(appendLe(bigSize ? kNeeds64 : static_cast<uint64_t>(m.size), 4));
    RETURN_IF_ERROR(appendLe(bigSize ? kNeeds64 : static_cast<uint64_t>(m.size), 4));
    RETURN_IF_ERROR(appendLe(m.name.size(), 2));
    RETURN_IF_ERROR(appendLe(extra ? extra + 4 : 0, 2));
    RETURN_IF_ERROR(appendLe(0, 2));  // comment
    RETURN_IF_ERROR(appendLe(0, 2));  // disk
    RETURN_IF_ERROR(appendLe(0, 2));  // internal attributes
    RETURN_IF_ERROR(appendLe(0, 4));  // external attributes
    RETURN_IF_ERROR(appendLe(bigOffset ? kNeeds64 : static_cast<uint64_t>(m.headerOffset), 4));
    RETURN_IF_ERROR(append(m.name.data(), m.name.size()));
    if (extra) {
      RETURN_IF_ERROR(appendLe(kZip64Extra, 2));
      RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(extra), 2));
      if (bigSize) RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(m.size), 8));
      if (bigSize) RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(m.size), 8));
      if (bigOffset) RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(m.headerOffset), 8));
    }
  }
  const uint64_t directorySize = static_cast<uint64_t>(offset_ - directoryOffset);
  const uint64_t count = members_.size();
  const bool zip64 = count >= 0xffff || directorySize >= zip64From_ || static_cast<uint64_t>(directoryOffset) >= zip64From_;
  if (zip64) {
    const int64_t recordOffset = offset_;
    RETURN_IF_ERROR(appendLe(kZip64EndOfDirectory, 4));
    RETURN_IF_ERROR(appendLe(kZip64EndBytes - 12, 8));
    RETURN_IF_ERROR(appendLe(45, 2));
    RETURN_IF_ERROR(appendLe(45, 2));
    RETURN_IF_ERROR(appendLe(0, 4));
    RETURN_IF_ERROR(appendLe(0, 4));
    RETURN_IF_ERROR(appendLe(count, 8));
    RETURN_IF_ERROR(appendLe(count, 8));
    RETURN_IF_ERROR(appendLe(directorySize, 8));
    RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(directoryOffset), 8));
    RETURN_IF_ERROR(appendLe(kZip64Locator, 4));
    RETURN_IF_ERROR(appendLe(0, 4));
    RETURN_IF_ERROR(appendLe(static_cast<uint64_t>(recordOffset), 8));
    RETURN_IF_ERROR(appendLe(1, 4));
  }
  RETURN_IF_ERROR(appendLe(kEndOfDirectory, 4));
  RETURN_IF_ERROR(appendLe(0, 2));
  RETURN_IF_ERROR(appendLe(0, 2));
  RETURN_IF_ERROR(appendLe(zip64 ? 0xffff : count, 2));
  RETURN_IF_ERROR(appendLe(zip64 ? 0xffff : count, 2));
  RETURN_IF_ERROR(appendLe(zip64 ? kNeeds64 : directorySize, 4));
  RETURN_IF_ERROR(appendLe(zip64 ? kNeeds64 : static_cast<uint64_t>(directoryOffset), 4));
  RETURN_IF_ERROR(appendLe(0, 2));
  return file_->commit();
}

}  // namespace loom::convert
