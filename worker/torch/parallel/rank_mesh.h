#pragma once

#include <memory>
#include <string>

#include "backends/communicator.h"
#include "common/status.h"
#include "planner/mesh.h"
#include "planner/plan.h"

namespace loom::worker {

// This rank's place in the Plan's mesh, as one value built once and passed down: its coordinates
// and one communicator per axis it belongs to, split from the world. Every axis has a
// communicator: one of size 1 is a backends::SelfCommunicator, whose collectives are no-ops, so
// the model and the ZeRO engines never ask whether a group exists. An axis that spans the world
// shares the world's communicator.
struct RankMesh {
  int rank = 0;
  int worldSize = 1;
  planner::Coordinates coordinates;  // dp, sp and tp indices
  std::shared_ptr<backends::Communicator> world;
  std::shared_ptr<backends::Communicator> tensor;      // tp: the ranks that split one layer's matrices
  std::shared_ptr<backends::Communicator> sequence;    // sp
  std::shared_ptr<backends::Communicator> data;        // dp: replicas of one tp x sp shard
  std::shared_ptr<backends::Communicator> denseData;   // dp x sp: dense gradients are averaged (and ZeRO-partitioned) here
  std::shared_ptr<backends::Communicator> expert;      // ep
  std::shared_ptr<backends::Communicator> expertData;  // dp x sp / ep: expert gradients

  const std::shared_ptr<backends::Communicator>& axis(planner::MeshAxis axis) const;
  // "rank 3 (dp 1, tp 1) of 4: tp 2 x dp 2"
  std::string describe() const;
};

// Splits `world` (null for a job of one rank) into the Plan's groups, axis after axis, group
// after group: every rank of the world must call it with the same Plan. Errors name the axis and
// its group.
StatusOr<RankMesh> buildRankMesh(std::shared_ptr<backends::Communicator> world, const planner::Plan& plan, int rank);

}  // namespace loom::worker
