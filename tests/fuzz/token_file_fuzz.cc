// A token file under mutation: its header (magic, version, dtype, vocabulary, tokenizer) and the
// token count it implies against the file's size.
#include "tests/fuzz/fuzz_driver.h"
#include "worker/data/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = loom::fuzz::scratchPath("train.tokens");
  loom::fuzz::writeScratch(path, data, size);
  (void)loom::data::TokenFile::open(path);
  return 0;
}

static const char kInteresting[] = "{}[]\":,0123456789LOOMTOKuint16uint32\x00\x01\xff";
LOOM_FUZZ_MAIN("loom-fuzz-token-file", std::string(kInteresting, sizeof kInteresting - 1))
