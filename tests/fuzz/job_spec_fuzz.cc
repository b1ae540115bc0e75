// The job spec under mutation: parseJobSpec (its DeepSpeed config inside), specPaths and
// resolveSpecPaths, as the planner runs them on every CreateJob.
#include <nlohmann/json.hpp>

#include "planner/job_spec.h"
#include "tests/fuzz/fuzz_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)loom::planner::parseJobSpec(text, loom::planner::SpecPurpose::kPlan);
  (void)loom::planner::resolveSpecPaths(text, "/base");
  auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_object()) (void)loom::planner::specPaths(json);
  return 0;
}

LOOM_FUZZ_MAIN("loom-fuzz-job-spec", "{}[]\":,0123456789.eE-truefalsenull\\")
