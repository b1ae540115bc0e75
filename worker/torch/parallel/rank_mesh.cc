#include "worker/torch/parallel/rank_mesh.h"

#include <algorithm>

#include <fmt/format.h>

#include "backends/self_communicator.h"

namespace loom::worker {

namespace {

using Comm = std::shared_ptr<backends::Communicator>;

const planner::RankGroups& groupsOf(const planner::PlanGroups& g, planner::MeshAxis axis) {
  switch (axis) {
    case planner::MeshAxis::kTensor: return g.tensor;
    case planner::MeshAxis::kSequence: return g.sequence;
    case planner::MeshAxis::kData: return g.data;
    case planner::MeshAxis::kDenseData: return g.denseData;
    case planner::MeshAxis::kExpert: return g.expert;
    case planner::MeshAxis::kExpertData: return g.expertData;
  }
  return g.tensor;
}

// This rank's communicator of `axis`. Every rank calls split for every group of size > 1 in the
// Plan's order (a split is collective over the world on NCCL), keeping the one it belongs to.
StatusOr<Comm> axisCommunicator(const Comm& world, const planner::Plan& plan, planner::MeshAxis axis, int rank) {
  const planner::RankGroups& groups = groupsOf(plan.groups, axis);
  const std::string name = planner::meshAxisName(axis);
  const int worldSize = plan.mesh.world;
  Comm mine;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& group = groups[g];
    const bool member = std::binary_search(group.begin(), group.end(), rank);
    if (group.size() == 1) {
      if (member) mine = std::make_shared<backends::SelfCommunicator>(fmt::format("{} group {}", name, g));
      continue;
    }
    if (static_cast<int>(group.size()) == worldSize) {
      if (member) mine = world;
      continue;
    }
    auto split = world->split(group, fmt::format("{} group {}", name, g));
    if (!split.isOk()) return split.status().withContext(fmt::format("mesh: the {} group {}", name, g));
    if (member) mine = std::move(split).value();
  }
  if (!mine) return internalError("mesh: rank {} is in no {} group of the Plan", rank, name);
  return mine;
}

}  // namespace

// The member of `mesh` for `axis`, const or not.
template <typename Mesh>
auto& memberOf(Mesh& mesh, planner::MeshAxis axis) {
  switch (axis) {
    case planner::MeshAxis::kTensor: return mesh.tensor;
    case planner::MeshAxis::kSequence: return mesh.sequence;
    case planner::MeshAxis::kData: return mesh.data;
    case planner::MeshAxis::kDenseData: return mesh.denseData;
    case planner::MeshAxis::kExpert: return mesh.expert;
    case planner::MeshAxis::kExpertData: return mesh.expertData;
  }
  return mesh.tensor;
}

const std::shared_ptr<backends::Communicator>& RankMesh::axis(planner::MeshAxis a) const { return memberOf(*this, a); }

std::string RankMesh::describe() const {
  std::string shape;
  auto add = [&](const char* name, const Comm& comm) {
    if (comm->size() > 1) shape += fmt::format("{}{} {}", shape.empty() ? "" : " x ", name, comm->size());
  };
  add("tp", tensor);
  add("sp", sequence);
  add("dp", data);
  add("ep", expert);
  return fmt::format("rank {} (dp {}, sp {}, tp {}) of {}: {}", rank, coordinates.dp, coordinates.sp, coordinates.tp,
                     worldSize, shape.empty() ? "one rank" : shape);
}

StatusOr<RankMesh> buildRankMesh(std::shared_ptr<backends::Communicator> world, const planner::Plan& plan, int rank) {
  const planner::PlanMesh& m = plan.mesh;
  if (!world) {
    if (m.world != 1) return internalError("mesh: the Plan has {} ranks, but this rank has no world communicator", m.world);
    world = std::make_shared<backends::SelfCommunicator>("world");
  }
  if (world->size() != m.world)
    return failedPrecondition("mesh: the Plan was compiled for {} ranks, the attempt has {}", m.world, world->size());
  ASSIGN_OR_RETURN(planner::Mesh mesh, planner::Mesh::create(m.world, m.tp, m.sp, m.ep));
  RankMesh out{.rank = rank, .worldSize = m.world, .coordinates = mesh.coordinates(rank), .world = world};
  for (planner::MeshAxis axis : {planner::MeshAxis::kTensor, planner::MeshAxis::kSequence, planner::MeshAxis::kData,
                                 planner::MeshAxis::kDenseData, planner::MeshAxis::kExpert,
                                 planner::MeshAxis::kExpertData}) {
    ASSIGN_OR_RETURN(Comm comm, axisCommunicator(world, plan, axis, rank));
    memberOf(out, axis) = std::move(comm);
  }
  return out;
}

}  // namespace loom::worker
