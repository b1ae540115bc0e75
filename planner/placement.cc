#include "planner/placement.h"

#include <algorithm>

#include <fmt/format.h>

namespace loom::planner {

NodeLocalGroup nodeLocalGroup(const DeepSpeedConfig& ds) {
  const int tp = ds.tensorParallel.ranks(), sp = ds.sequenceParallelSize;
  NodeLocalGroup group{.size = tp * sp, .what = {}};
  if (tp > 1) group.what = fmt::format("deepspeed.tensor_parallel.autotp_size {}", tp);
  if (sp > 1) group.what += fmt::format("{}deepspeed.sequence_parallel_size {}", tp > 1 ? " x " : "", sp);
  return group;
}

Status checkNodeLocalGroupFits(const NodeLocalGroup& group, const std::vector<NodeCapacity>& nodes) {
  if (group.size <= 1 || nodes.empty()) return Status::ok();
  int largest = 0;
  for (const auto& n : nodes) largest = std::max(largest, n.totalSlots);
  if (largest >= group.size) return Status::ok();
  return failedPrecondition("{}: each group of {} ranks must lie inside one node, and the largest of the {} attached "
                            "node{} has {} slot{}",
                            group.what, group.size, nodes.size(), nodes.size() == 1 ? "" : "s", largest,
                            largest == 1 ? "" : "s");
}

StatusOr<Placement> placeGang(int ranks, std::vector<NodeCapacity> nodes, const NodeLocalGroup& group,
                              const std::string& unit) {
  const int groupSize = std::max(1, group.size);
  std::sort(nodes.begin(), nodes.end(), [](const NodeCapacity& a, const NodeCapacity& b) {
    return a.freeSlots != b.freeSlots ? a.freeSlots > b.freeSlots : a.nodeId < b.nodeId;
  });
  int free = 0, total = 0;
  for (const auto& n : nodes) {
    free += std::max(0, n.freeSlots);
    total += n.totalSlots;
  }
  if (total < ranks) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("waiting for nodes: needs {} {}s, the {} attached node{} {} {} in all", ranks, unit,
                              nodes.size(), nodes.size() == 1 ? "" : "s", nodes.size() == 1 ? "has" : "have", total));
  }
  if (free < ranks) {
    std::string detail;
    for (const auto& n : nodes) {
      if (!detail.empty()) detail += ", ";
      detail += fmt::format("{} {}", n.nodeId, n.freeSlots);
    }
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("waiting for {} free {}{}: {} free on {} node{}{}", ranks, unit, ranks == 1 ? "" : "s", free,
                              nodes.size(), nodes.size() == 1 ? "" : "s", detail.empty() ? "" : " (" + detail + ")"));
  }
  // Prefer the single node with the fewest free slots that still holds the whole gang, leaving
  // big nodes for big jobs; otherwise spread over the largest nodes first.
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    if (it->freeSlots >= ranks) {
      NodeRanks only{.nodeId = it->nodeId, .ranks = {}};
      for (int r = 0; r < ranks; ++r) only.ranks.push_back(r);
      return Placement{only};
    }
  }
  Placement placement;
  int next = 0;
  for (const auto& n : nodes) {
    if (next == ranks) break;
    int take = std::min(n.freeSlots, ranks - next) / groupSize * groupSize;
    if (take <= 0) continue;
    NodeRanks node{.nodeId = n.nodeId, .ranks = {}};
    for (int i = 0; i < take; ++i) node.ranks.push_back(next++);
    placement.push_back(std::move(node));
  }
  if (next < ranks) {
    std::string detail;
    for (const auto& n : nodes) detail += fmt::format("{}{} {}", detail.empty() ? "" : ", ", n.nodeId, n.freeSlots);
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("waiting for nodes: {}: each group of {} ranks must lie inside one node, and the free "
                              "slots ({}) hold {} of the {} ranks that way",
                              group.what, groupSize, detail, next, ranks));
  }
  return placement;
}

}  // namespace loom::planner
