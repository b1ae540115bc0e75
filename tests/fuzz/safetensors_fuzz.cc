// A safetensors file under mutation: its 8-byte header length and JSON header (dtypes, shapes,
// offsets against the file's size), then every tensor's bytes read through them.
#include <vector>

#include "tests/fuzz/fuzz_driver.h"
#include "worker/checkpoint/safetensors_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = loom::fuzz::scratchPath("model.safetensors");
  loom::fuzz::writeScratch(path, data, size);
  auto file = loom::checkpoint::SafetensorsFile::open(path);
  if (!file.isOk()) return 0;
  std::vector<char> buffer;
  for (const auto& tensor : (*file)->tensors()) {
    const int64_t bytes = tensor.entry.bytes();
    if (bytes < 0 || bytes > (1 << 20)) continue;
    buffer.resize(static_cast<size_t>(bytes));
    (void)(*file)->read(tensor.offset, bytes, buffer.data());
  }
  return 0;
}

static const char kInteresting[] = "{}[]\":,0123456789_FBIU\x00\x01\x08\xff";
LOOM_FUZZ_MAIN("loom-fuzz-safetensors", std::string(kInteresting, sizeof kInteresting - 1))
