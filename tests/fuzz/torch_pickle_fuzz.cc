// The torch.save readers (worker/convert/) under mutation: the restricted pickle reader and the
// zip archive reader (tests/fuzz/fuzz_driver.h says how it is built and run).
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_driver.h"
#include "worker/convert/torch_pickle.h"
#include "worker/convert/zip_archive.h"

namespace {

void readBoth(const std::string& bytes) {
  (void)loom::convert::readTorchPickle(bytes, "fuzz input");
  // The same bytes as an archive, through a file as the reader wants one.
  static const std::string path = loom::fuzz::scratchPath("archive.zip");
  loom::fuzz::writeScratch(path, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  auto zip = loom::convert::ZipArchive::open(path);
  if (zip.isOk()) {
    for (const auto& entry : zip->entries()) {
      if (entry.size > (1 << 20)) continue;
      auto member = zip->readAll(entry);
      if (member.isOk()) (void)loom::convert::readTorchPickle(*member, entry.name);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  readBoth(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}

LOOM_FUZZ_MAIN("loom-fuzz-torch-pickle", "\x80\x02()]}qhrjQRb\x81\x93\x8a\x8bXKJMGcNtse\x85\x86\x87PK\x01\x02\x03\x04\x05\x06\xff")
