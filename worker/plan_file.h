#pragma once

#include <string>

#include "common/status.h"
#include "planner/plan.h"

namespace loom::worker {

// The Plan a rank executes, as its launch handed it over (LOOM_PLAN: the loom.v1.Plan bytes the
// planner compiled on submit). An unreadable or corrupt file is an error naming it.
//
// The bytes are read by libloom_worker_proto.so ($LOOM_WORKER_PROTO, else ../lib/ beside the
// worker binary), loaded on the first call: linking libprotobuf costs every exec of the worker
// about 1.2 ms, which the ranks that read no plan (probe, convert) need not pay. The library also
// holds the generated messages and their conversions for libloom_rollout_service.so, so that
// protobuf registers each file once per process.
StatusOr<planner::Plan> readPlanFile(const std::string& path);

using ReadPlanFileFn = StatusOr<planner::Plan> (*)(const std::string& path);

}  // namespace loom::worker

// Exported by libloom_worker_proto.so: the reader behind readPlanFile.
extern "C" loom::worker::ReadPlanFileFn loom_plan_reader();
