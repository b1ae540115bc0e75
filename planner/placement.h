#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "planner/deepspeed_config.h"
#include "planner/job.h"

namespace loom::planner {

struct NodeCapacity {
  std::string nodeId;
  int freeSlots = 0;
  int totalSlots = 0;
};

// The consecutive ranks that must share a node: a tensor-parallel group, inside the
// sequence-parallel group it belongs to (the mesh puts tp fastest-varying, then sp). Both
// exchange activations in every layer, too often for the network between nodes.
struct NodeLocalGroup {
  int size = 1;
  std::string what;  // the settings that make it, for messages
};
NodeLocalGroup nodeLocalGroup(const DeepSpeedConfig& ds);

// Gang placement: all `ranks` get a slot or none does. Ranks are packed onto as few nodes as
// possible, consecutive ranks on one node. A node takes a multiple of `group.size` ranks, so that
// every such group lies inside one node. ResourceExhausted, with the free slots named, when the
// gang does not fit.
// `unit` names what the capacities count, for the messages ("slot"; for a cuda
// job on nodes that count their GPUs: "GPU slot").
StatusOr<Placement> placeGang(int ranks, std::vector<NodeCapacity> nodes, const NodeLocalGroup& group = {},
                              const std::string& unit = "slot");

// At submit: FailedPrecondition when no attached node has the slots for one such group (the job
// would wait for ever); OK when none is attached yet.
Status checkNodeLocalGroupFits(const NodeLocalGroup& group, const std::vector<NodeCapacity>& nodes);

}  // namespace loom::planner
