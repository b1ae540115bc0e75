#include "worker/data/token_file.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace loom::data {

namespace {

using nlohmann::json;

constexpr int64_t kPreambleBytes = 16;  // magic + header length
constexpr size_t kMagicBytes = sizeof(kTokenFileMagic) - 1;

int64_t roundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Byte by byte, so the file reads the same on any host; compilers turn this into one load.
uint64_t loadLittle(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

void storeLittle(uint64_t v, int bytes, unsigned char* p) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// The rules every header obeys, checked on the way in (open) and on the way out (write), so a file
// this code writes is always one it can read.
Status validateHeader(const TokenFileHeader& h) {
  if (h.formatVersion != kTokenFileFormatVersion)
    return invalidArgument("format_version {} is not supported (this build reads {})", h.formatVersion,
                           kTokenFileFormatVersion);
  const int bytes = dtypeBytes(h.dtype);
  if (bytes == 0) return invalidArgument("dtype: unknown \"{}\" (uint16 or uint32)", h.dtype);
  // The dtype must hold every id of the vocabulary, not just those of this corpus: otherwise a
  // sample fits and the full corpus fails.
  const int64_t dtypeIds = int64_t{1} << (8 * bytes);
  if (h.vocabSize < 1 || h.vocabSize > dtypeIds)
    return invalidArgument("vocab_size: must be between 1 and {} for dtype {}, got {}", dtypeIds, h.dtype, h.vocabSize);
  if (h.numTokens < 0) return invalidArgument("num_tokens: must not be negative, got {}", h.numTokens);
  if (h.eosTokenId < -1 || h.eosTokenId >= h.vocabSize)
    return invalidArgument("eos_token_id: must be -1 (none) or below vocab_size {}, got {}", h.vocabSize,
                           h.eosTokenId);
  const auto& starts = h.documentStarts;
  if (h.numTokens == 0 && !starts.empty())
    return invalidArgument("document_starts: must be empty when num_tokens is 0, got {} entries", starts.size());
  if (h.numTokens > 0 && starts.empty())
    return invalidArgument("document_starts: is empty, but num_tokens is {} (the first document starts at 0)",
                           h.numTokens);
  if (!starts.empty() && starts[0] != 0) return invalidArgument("document_starts[0]: must be 0, got {}", starts[0]);
  for (size_t i = 1; i < starts.size(); ++i) {
    if (starts[i] <= starts[i - 1])
      return invalidArgument("document_starts[{}]: {} is not after document_starts[{}] = {} (must be ascending)", i,
                             starts[i], i - 1, starts[i - 1]);
    if (starts[i] >= h.numTokens)
      return invalidArgument("document_starts[{}]: {} is out of range (num_tokens {})", i, starts[i], h.numTokens);
  }
  return Status::ok();
}

StatusOr<const json*> requiredKey(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) return invalidArgument("{}: required key is missing", key);
  return &*it;
}

Status readInt(const json& object, const char* key, int64_t* out) {
  ASSIGN_OR_RETURN(const json* value, requiredKey(object, key));
  if (!value->is_number_integer()) return invalidArgument("{}: must be an integer, got {}", key, value->type_name());
  if (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
    return invalidArgument("{}: {} is out of range", key, value->get<uint64_t>());
  *out = value->get<int64_t>();
  return Status::ok();
}

Status readString(const json& object, const char* key, std::string* out) {
  ASSIGN_OR_RETURN(const json* value, requiredKey(object, key));
  if (!value->is_string()) return invalidArgument("{}: must be a string, got {}", key, value->type_name());
  *out = value->get<std::string>();
  return Status::ok();
}

StatusOr<TokenFileHeader> parseHeader(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // a parse error, or out_of_range: a number too large
    return invalidArgument("header is not valid JSON: {}", e.what());
  }
  if (!j.is_object()) return invalidArgument("header must be a JSON object, got {}", j.type_name());

  TokenFileHeader h;
  // The version first: a newer file may lack or retype the other keys, and its version is the
  // one message that helps.
  int64_t version = 0;
  RETURN_IF_ERROR(readInt(j, "format_version", &version));
  if (version != kTokenFileFormatVersion)
    return invalidArgument("format_version {} is not supported (this build reads {})", version,
                           kTokenFileFormatVersion);
  h.formatVersion = static_cast<int>(version);
  RETURN_IF_ERROR(readString(j, "dtype", &h.dtype));
  RETURN_IF_ERROR(readInt(j, "vocab_size", &h.vocabSize));
  RETURN_IF_ERROR(readInt(j, "num_tokens", &h.numTokens));
  RETURN_IF_ERROR(readString(j, "tokenizer", &h.tokenizer));
  RETURN_IF_ERROR(readInt(j, "eos_token_id", &h.eosTokenId));
  ASSIGN_OR_RETURN(const json* starts, requiredKey(j, "document_starts"));
  if (!starts->is_array()) return invalidArgument("document_starts: must be an array, got {}", starts->type_name());
  h.documentStarts.reserve(starts->size());
  for (size_t i = 0; i < starts->size(); ++i) {
    const json& s = (*starts)[i];
    if (!s.is_number_integer())
      return invalidArgument("document_starts[{}]: must be an integer, got {}", i, s.type_name());
    if (s.is_number_unsigned() && s.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
      return invalidArgument("document_starts[{}]: {} is out of range", i, s.get<uint64_t>());
    h.documentStarts.push_back(s.get<int64_t>());
  }
  // Other keys are ignored: a writer may record where the data came from.
  RETURN_IF_ERROR(validateHeader(h));
  return h;
}

std::string headerJson(const TokenFileHeader& h) {
  nlohmann::ordered_json j;  // in the documented order, for whoever reads the header with `head -c`
  j["format_version"] = h.formatVersion;
  j["dtype"] = h.dtype;
  j["vocab_size"] = h.vocabSize;
  j["num_tokens"] = h.numTokens;
  j["tokenizer"] = h.tokenizer;
  j["eos_token_id"] = h.eosTokenId;
  j["document_starts"] = h.documentStarts;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Status writeAll(int fd, const unsigned char* data, size_t size, const std::string& what) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("write " + what);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

// The whole file in chunks, so the encoded tokens are never all in memory at once beside `tokens`.
Status writeContent(int fd, const std::string& tmp, const TokenFileHeader& header, const std::string& headerText,
                    const std::vector<uint32_t>& tokens) {
  const int64_t dataOffset = roundUp(kPreambleBytes + static_cast<int64_t>(headerText.size()), kTokenDataAlignment);
  std::vector<unsigned char> buffer(static_cast<size_t>(dataOffset), 0);
  std::memcpy(buffer.data(), kTokenFileMagic, kMagicBytes);
  storeLittle(headerText.size(), 8, buffer.data() + kMagicBytes);
  std::memcpy(buffer.data() + kPreambleBytes, headerText.data(), headerText.size());
  RETURN_IF_ERROR(writeAll(fd, buffer.data(), buffer.size(), tmp));

  const int bytes = dtypeBytes(header.dtype);
  constexpr size_t kChunkTokens = size_t{1} << 16;
  buffer.resize(kChunkTokens * bytes);
  for (size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    const size_t end = std::min(tokens.size(), begin + kChunkTokens);
    for (size_t i = begin; i < end; ++i) storeLittle(tokens[i], bytes, buffer.data() + (i - begin) * bytes);
    RETURN_IF_ERROR(writeAll(fd, buffer.data(), (end - begin) * bytes, tmp));
  }
  if (::fsync(fd) != 0) return errnoStatus("fsync " + tmp);
  return Status::ok();
}

}  // namespace

int dtypeBytes(const std::string& dtype) {
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  return 0;
}

Status writeTokenFile(const std::string& path, TokenFileHeader header, const std::vector<uint32_t>& tokens) {
  header.numTokens = static_cast<int64_t>(tokens.size());
  RETURN_IF_ERROR(validateHeader(header).withContext(path));
  const uint64_t dtypeMax = (uint64_t{1} << (8 * dtypeBytes(header.dtype))) - 1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > dtypeMax)
      return invalidArgument("{}: tokens[{}] = {} does not fit dtype {}", path, i, tokens[i], header.dtype);
    if (tokens[i] >= header.vocabSize)
      return invalidArgument("{}: tokens[{}] = {} is not below vocab_size {}", path, i, tokens[i], header.vocabSize);
  }

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errnoStatus("create " + tmp);
  Status written = writeContent(fd, tmp, header, headerJson(header), tokens);
  if (::close(fd) != 0 && written.isOk()) written = errnoStatus("close " + tmp);
  if (written.isOk() && ::rename(tmp.c_str(), path.c_str()) != 0)
    written = errnoStatus("rename " + tmp + " to " + path);
  if (!written.isOk()) {
    ::unlink(tmp.c_str());
    return written;
  }
  // The rename is durable only once the directory is.
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dirFd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd < 0) return errnoStatus("open " + dir);
  int rc = ::fsync(dirFd);
  ::close(dirFd);
  if (rc != 0) return errnoStatus("fsync " + dir);
  return Status::ok();
}

StatusOr<TokenFile> TokenFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return invalidArgument("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = errnoStatus("stat " + path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalidArgument("{}: not a regular file", path);
  }
  const int64_t fileBytes = st.st_size;
  if (fileBytes < kPreambleBytes) {
    ::close(fd);
    return invalidArgument("{}: not a Loom token file (only {} bytes)", path, fileBytes);
  }
  void* mapping = ::mmap(nullptr, static_cast<size_t>(fileBytes), PROT_READ, MAP_SHARED, fd, 0);
  int mmapErrno = errno;
  ::close(fd);  // the mapping keeps the file open
  if (mapping == MAP_FAILED) {
    errno = mmapErrno;
    return errnoStatus("mmap " + path);
  }
  TokenFile file;  // from here on it owns the mapping: an early return unmaps it
  file.path_ = path;
  file.mapping_ = mapping;
  file.mappingBytes_ = static_cast<size_t>(fileBytes);
  const auto* bytes = static_cast<const unsigned char*>(mapping);

  if (std::memcmp(bytes, kTokenFileMagic, kMagicBytes) != 0)
    return invalidArgument("{}: not a Loom token file (it does not start with \"{}\")", path, kTokenFileMagic);
  const uint64_t headerBytes = loadLittle(bytes + kMagicBytes, 8);
  if (headerBytes > static_cast<uint64_t>(fileBytes - kPreambleBytes))
    return invalidArgument("{}: the header length {} runs past the end of the file ({} bytes)", path, headerBytes,
                           fileBytes);
  auto header = parseHeader(std::string(reinterpret_cast<const char*>(bytes + kPreambleBytes), headerBytes));
  if (!header.isOk()) return header.status().withContext(path);
  file.header_ = std::move(header).value();

  file.tokenBytes_ = dtypeBytes(file.header_.dtype);
  const int64_t dataOffset = roundUp(kPreambleBytes + static_cast<int64_t>(headerBytes), kTokenDataAlignment);
  const int64_t numTokens = file.header_.numTokens;
  if (numTokens > (std::numeric_limits<int64_t>::max() - dataOffset) / file.tokenBytes_)
    return invalidArgument("{}: num_tokens {} is out of range", path, numTokens);
  const int64_t expectedBytes = dataOffset + numTokens * file.tokenBytes_;
  if (expectedBytes != fileBytes)
    return invalidArgument("{}: the file is {} bytes, expected {} ({} {} tokens from offset {}); truncated or not "
                           "written completely?",
                           path, fileBytes, expectedBytes, numTokens, file.header_.dtype, dataOffset);
  file.tokens_ = bytes + dataOffset;
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this == &other) return *this;
  unmap();
  path_ = std::move(other.path_);
  header_ = std::move(other.header_);
  mapping_ = std::exchange(other.mapping_, nullptr);
  mappingBytes_ = std::exchange(other.mappingBytes_, 0);
  tokens_ = std::exchange(other.tokens_, nullptr);
  tokenBytes_ = std::exchange(other.tokenBytes_, 0);
  return *this;
}

TokenFile::~TokenFile() { unmap(); }

void TokenFile::unmap() {
  if (mapping_) ::munmap(mapping_, mappingBytes_);
  mapping_ = nullptr;
  mappingBytes_ = 0;
  tokens_ = nullptr;
}

void TokenFile::read(int64_t start, int64_t count, int64_t* out) const {
  assert(start >= 0 && count >= 0 && start <= size() - count);
  const unsigned char* p = tokens_ + start * tokenBytes_;
  if (tokenBytes_ == 2) {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(loadLittle(p + 2 * i, 2));
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(loadLittle(p + 4 * i, 4));
  }
}

}  // namespace loom::data
