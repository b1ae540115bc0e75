// libloom_worker_proto.so's entry (worker/plan_file.h): a Plan file's loom.v1.Plan bytes into the
// plain struct.
#include "common/files.h"
#include "proto/convert.h"
#include "worker/plan_file.h"

namespace loom::worker {
namespace {

StatusOr<planner::Plan> parsePlanFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string bytes, files::readFile(path));
  v1::Plan plan;
  if (!plan.ParseFromString(bytes)) return Status(StatusCode::kDataLoss, path + ": not a loom.v1.Plan");
  return convert::fromProto(plan);
}

}  // namespace
}  // namespace loom::worker

extern "C" loom::worker::ReadPlanFileFn loom_plan_reader() { return &loom::worker::parsePlanFile; }
