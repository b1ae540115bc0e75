#pragma once

#include "common/status.h"
#include "planner/job_spec.h"
#include "planner/plan.h"

namespace loom::planner {

// Reads the model config a train or eval spec names (model.config, an absolute path once
// loomctl has resolved it) and compiles the job's Plan (plan_compiler.h). Every failure is
// InvalidArgument: a config that cannot be read or parsed names model.config and the path; a job
// that does not compile gives the compiler's reason. The I/O half of compiling, for the planner
// service (on submit) and `loomctl plan`.
// With SpecPurpose::kRun the Plan must also be one the workers execute (checkPlanRunnable).
StatusOr<Plan> compileJobPlan(const JobSpec& spec, SpecPurpose purpose = SpecPurpose::kRun);

}  // namespace loom::planner
