#include "worker/plan_file.h"

#include "common/files.h"
#include "proto/convert.h"

namespace loom::worker {

StatusOr<planner::Plan> readPlanFile(const std::string& path) {
  if (path.empty())
    return failedPrecondition("LOOM_PLAN: the launch handed this rank no plan (train and eval jobs are compiled on "
                              "submit, and the plan travels with the launch)");
  ASSIGN_OR_RETURN(const std::string bytes, files::readFile(path));
  v1::Plan plan;
  if (!plan.ParseFromString(bytes)) return Status(StatusCode::kDataLoss, path + ": not a loom.v1.Plan");
  return convert::fromProto(plan);
}

}  // namespace loom::worker
