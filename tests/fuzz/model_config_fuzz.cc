// A Hugging Face config.json under mutation (parseModelConfig: every family Loom reads).
#include "planner/model_config.h"
#include "tests/fuzz/fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)loom::planner::parseModelConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz config.json");
  return 0;
}

LOOM_FUZZ_MAIN("loom-fuzz-model-config", "{}[]\":,0123456789.eE-truefalsenull")
