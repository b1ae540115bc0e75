// The planner's tokens file and tenants file under mutation: what an operator writes, read again
// on every change.
#include "common/security/tokens.h"
#include "planner/tenants.h"
#include "tests/fuzz/fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)loom::security::parseTokensFile(text, "tokens");
  (void)loom::planner::parseTenantsFile(text, "tenants.json");
  return 0;
}

LOOM_FUZZ_MAIN("loom-fuzz-tokens-file", "sha256:0123456789abcdef -*#\nadminusernode{}[]\":,/")
