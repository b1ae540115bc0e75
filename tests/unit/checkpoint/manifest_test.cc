#include "worker/checkpoint/manifest.h"

#include <zlib.h>

#include <fstream>
#include <string>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using loom::StatusCode;
using loom::checkpoint::checkManifest;
using loom::checkpoint::crc32OfFile;
using loom::checkpoint::writeManifest;

namespace {

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string patterned(size_t size) {
  std::string bytes(size, '\0');
  uint32_t x = 12345;
  for (char& c : bytes) c = static_cast<char>((x = x * 1103515245u + 12345u) >> 24);
  return bytes;
}

}  // namespace

TEST_CASE("crc32OfFile: a file read in pieces by several threads has zlib's CRC-32 of the whole", "[checkpoint]") {
  loom::testing::TempDir dir;
  // Two whole 64 MiB pieces and a short one, an empty file, and one smaller than a piece.
  for (size_t size : {size_t(0), size_t(1000), (size_t(128) << 20) + 12345}) {
    const std::string bytes = patterned(size), path = dir.path() + "/f" + std::to_string(size);
    writeBytes(path, bytes);
    const uLong whole = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
                              static_cast<uInt>(bytes.size()));
    auto crc = crc32OfFile(path);
    REQUIRE(crc.isOk());
    CHECK(*crc == static_cast<uint32_t>(whole));
  }
  CHECK(crc32OfFile(dir.path() + "/absent").status().code() == StatusCode::kNotFound);
}

TEST_CASE("checkManifest: every file, or only the ones a reader names", "[checkpoint]") {
  loom::testing::TempDir dir;
  const std::string d = dir.path();
  writeBytes(d + "/model.safetensors", patterned(4096));
  writeBytes(d + "/optimizer.safetensors", patterned(8192));
  REQUIRE(writeManifest(d, "global_step3").isOk());
  CHECK(checkManifest(d).isOk());

  // The optimizer state is damaged: a check of the weights alone passes, a whole check names the file.
  std::string damaged = patterned(8192);
  damaged[100] ^= 1;
  writeBytes(d + "/optimizer.safetensors", damaged);
  CHECK(checkManifest(d, {"model.safetensors"}).isOk());
  auto whole = checkManifest(d);
  CHECK(whole.code() == StatusCode::kDataLoss);
  CHECK(whole.message() == d + "/optimizer.safetensors: CRC-32 does not match the manifest: the file is corrupt");

  // A file the reader wants that the manifest does not list is refused by name.
  auto unlisted = checkManifest(d, {"model.safetensors", "model-00002.safetensors"});
  CHECK(unlisted.code() == StatusCode::kDataLoss);
  CHECK(unlisted.message() == d + "/model-00002.safetensors: not listed in the manifest");

  // A named file cut short: its size is checked before its CRC.
  writeBytes(d + "/model.safetensors", patterned(4000));
  auto cut = checkManifest(d, {"model.safetensors"});
  CHECK(cut.code() == StatusCode::kDataLoss);
  CHECK(cut.message() == d + "/model.safetensors: 4000 bytes, the manifest says 4096");
}
