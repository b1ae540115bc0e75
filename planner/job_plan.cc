#include "planner/job_plan.h"

#include "common/files.h"
#include "planner/model_config.h"
#include "planner/plan_compiler.h"

namespace loom::planner {

StatusOr<Plan> compileJobPlan(const JobSpec& spec, SpecPurpose purpose) {
  RETURN_IF_ERROR(checkHasPlan(spec));
  auto text = files::readFile(spec.model.config);
  if (!text.isOk()) return invalidArgument("model.config: {}", text.status().message());
  auto model = parseModelConfig(*text, spec.model.config);
  if (!model.isOk()) return model.status().withContext("model.config");
  ASSIGN_OR_RETURN(Plan plan, compilePlan(*model, spec));
  if (purpose == SpecPurpose::kRun) RETURN_IF_ERROR(checkPlanRunnable(plan));
  return plan;
}

}  // namespace loom::planner
