#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/job.h"

namespace loom::planner {

struct NodeCapacity {
  std::string nodeId;
  int freeSlots = 0;
  int totalSlots = 0;
};

// Gang placement: all `ranks` get a slot or none does. Ranks are packed onto as few nodes as
// possible, consecutive ranks on one node (the mesh puts tp fastest-varying, so neighbouring
// ranks talk most). A node takes a multiple of `groupSize` ranks, so that every tensor-parallel
// group of that many consecutive ranks lies inside one node. ResourceExhausted, with the free
// slots named, when the gang does not fit.
StatusOr<Placement> placeGang(int ranks, std::vector<NodeCapacity> nodes, int groupSize = 1);

}  // namespace loom::planner
