#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::data {

// A token file (`*.tokens`) holds a tokenized corpus, ready to be mapped and sliced by a trainer:
//   bytes 0-7   magic "LOOMTOK1"
//   bytes 8-15  little-endian uint64 H: the length of the JSON header
//   bytes 16..  the header, H bytes of UTF-8 JSON (keys as in TokenFileHeader, snake_case)
//   zero padding up to the next multiple of kTokenDataAlignment
//   the tokens, flat, little-endian, of the header's dtype
// The format is documented for users in docs/user-guide.md ("Training data").
inline constexpr char kTokenFileMagic[] = "LOOMTOK1";
inline constexpr int kTokenFileFormatVersion = 1;
// Tokens start on a 64-byte boundary so that a mapping of the file can be read (or copied to a
// device) as an aligned array.
inline constexpr int64_t kTokenDataAlignment = 64;

struct TokenFileHeader {
  int formatVersion = kTokenFileFormatVersion;
  std::string dtype = "uint16";  // "uint16" or "uint32"
  int64_t vocabSize = 0;
  int64_t numTokens = 0;
  std::string tokenizer;  // the name of what produced the ids, e.g. "bytes"
  int64_t eosTokenId = -1;  // -1: none
  // The offset of each document's first token: ascending, the first 0; empty iff there are no tokens.
  std::vector<int64_t> documentStarts;
};

// The size of one token of `dtype` in bytes, 0 for an unknown dtype.
int dtypeBytes(const std::string& dtype);

// Writes atomically (temporary file beside `path`, fsync, rename): a reader sees the old file or
// the new, never a torn one. header.numTokens is set from `tokens`; the dtype is the caller's
// choice, and a token that does not fit it or is not below vocabSize is an error, as is a header
// that open() would refuse.
Status writeTokenFile(const std::string& path, TokenFileHeader header, const std::vector<uint32_t>& tokens);

// A token file opened read-only and memory-mapped: pages are read from disk as they are touched,
// so a file larger than memory is fine. Movable, not copyable; the mapping ends with the object.
// Immutable after open(), so every const method may be called from any thread.
class TokenFile {
 public:
  // Validates the magic, the header (every key, its type and range) and the file size against
  // num_tokens; every error is INVALID_ARGUMENT and names the file. Token values are not scanned:
  // they are as the writer checked them.
  static StatusOr<TokenFile> open(const std::string& path);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  const TokenFileHeader& header() const { return header_; }
  int64_t size() const { return header_.numTokens; }  // in tokens

  // Copies tokens [start, start + count) into `out`, widened to int64. The range must lie within
  // [0, size()]: the caller checks (asserted here, not reported).
  void read(int64_t start, int64_t count, int64_t* out) const;

 private:
  TokenFile() = default;
  void unmap();

  std::string path_;
  TokenFileHeader header_;
  void* mapping_ = nullptr;
  size_t mappingBytes_ = 0;
  const unsigned char* tokens_ = nullptr;  // inside the mapping
  int tokenBytes_ = 0;
};

}  // namespace loom::data
