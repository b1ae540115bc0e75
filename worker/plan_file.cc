#include "worker/plan_file.h"

#include "worker/sibling_library.h"

namespace loom::worker {

StatusOr<planner::Plan> readPlanFile(const std::string& path) {
  if (path.empty())
    return failedPrecondition("LOOM_PLAN: the launch handed this rank no plan (train and eval jobs are compiled on "
                              "submit, and the plan travels with the launch)");
  static const StatusOr<ReadPlanFileFn> reader = callSiblingEntry<ReadPlanFileFn>(
      "LOOM_WORKER_PROTO", "libloom_worker_proto.so", "loom_plan_reader", "the plan reader");
  if (!reader.isOk()) return reader.status();
  return (*reader)(path);
}

}  // namespace loom::worker
