// A checkpoint's manifest.json under mutation: checkManifest reads it and checks the files it
// names (sizes and CRCs) in the checkpoint directory.
#include <filesystem>

#include "tests/fuzz/fuzz_driver.h"
#include "worker/checkpoint/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = loom::fuzz::scratchPath("checkpoint");
    std::filesystem::create_directories(d);
    loom::fuzz::writeScratch(d + "/model.safetensors", reinterpret_cast<const uint8_t*>("0123456789"), 10);
    return d;
  }();
  loom::fuzz::writeScratch(dir + "/manifest.json", data, size);
  (void)loom::checkpoint::checkManifest(dir);
  return 0;
}

LOOM_FUZZ_MAIN("loom-fuzz-checkpoint-manifest", "{}[]\":,0123456789./-truefalsenull")
