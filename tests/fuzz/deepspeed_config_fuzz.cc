// A DeepSpeed config under mutation, as parseJobSpec hands its "deepspeed" object over: for a
// training job and an inference job, at a few world sizes.
#include <nlohmann/json.hpp>

#include "planner/deepspeed_config.h"
#include "tests/fuzz/fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto json = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  for (int64_t world : {1, 8, 12})
    for (bool training : {true, false}) (void)loom::planner::parseDeepSpeedConfig(json, world, training);
  return 0;
}

LOOM_FUZZ_MAIN("loom-fuzz-deepspeed-config", "{}[]\":,0123456789.eE-truefalsenullauto")
