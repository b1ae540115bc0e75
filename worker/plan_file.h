#pragma once

#include <string>

#include "common/status.h"
#include "planner/plan.h"

namespace loom::worker {

// The Plan a rank executes, as its launch handed it over (LOOM_PLAN: the loom.v1.Plan bytes the
// planner compiled on submit). An unreadable or corrupt file is an error naming it.
StatusOr<planner::Plan> readPlanFile(const std::string& path);

}  // namespace loom::worker
