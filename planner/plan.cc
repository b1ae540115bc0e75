#include "planner/plan.h"

#include "common/shape.h"
#include "planner/mesh.h"

namespace loom::planner {

int64_t ParameterSpec::numel() const { return numelOf(shape); }
int64_t ParameterSpec::localNumel() const { return numelOf(localShape); }

int64_t Plan::totalElements() const {
  int64_t n = 0;
  for (const auto& p : parameters) n += p.numel();
  return n;
}

std::vector<int> parametersOfRank(const Plan& plan, int rank) {
  const PlanMesh& m = plan.mesh;
  auto mesh = Mesh::create(m.world, m.tp, m.sp, m.ep);
  const int expertIndex = mesh.isOk() ? mesh->expertIndex(rank) : 0;
  std::vector<int> out;
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const ParameterSpec& p = plan.parameters[i];
    if (p.expert < 0 || p.expertOwner == expertIndex) out.push_back(static_cast<int>(i));
  }
  return out;
}

Plan planOfRank(const Plan& plan, int rank) {
  if (plan.mesh.ep == 1) return plan;
  const std::vector<int> held = parametersOfRank(plan, rank);
  std::vector<int> renumbered(plan.parameters.size(), -1);
  Plan out = plan;
  out.parameters.clear();
  for (int i : held) {
    renumbered[i] = static_cast<int>(out.parameters.size());
    out.parameters.push_back(plan.parameters[i]);
  }
  auto mesh = Mesh::create(plan.mesh.world, plan.mesh.tp, plan.mesh.sp, plan.mesh.ep);
  const int expertIndex = mesh.isOk() ? mesh->expertIndex(rank) : 0;
  for (FlatBufferSpec& buffer : out.zero.buffers) {
    std::vector<int> members = buffer.members[buffer.experts ? expertIndex : 0];
    for (int& i : members) i = renumbered[i];
    buffer.members = {std::move(members)};
  }
  return out;
}

int64_t shardElements(const Plan& plan, int rank) {
  int64_t n = 0;
  for (int i : parametersOfRank(plan, rank)) n += plan.parameters[i].localNumel();
  return n;
}

int64_t keptElements(const Plan& plan, int rank) {
  if (plan.zero.stage < 3) return shardElements(plan, rank);
  int64_t n = 0;
  for (int i : parametersOfRank(plan, rank)) {
    const ParameterSpec& p = plan.parameters[i];
    n += !p.trainable || p.persistent ? p.localNumel() : p.partitionNumel;
  }
  return n;
}

}  // namespace loom::planner
