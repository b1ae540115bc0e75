#include "worker/checkpoint/state_layout.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/shape.h"
#include "planner/mesh.h"
#include "planner/optimizer_rules.h"

namespace loom::checkpoint {

namespace {

using planner::ParameterSpec;

bool trains(const ParameterSpec& p) { return p.trainable && !p.frozen; }

const std::vector<std::string>& stateNames(const planner::DeepSpeedConfig& config, const ParameterSpec& p) {
  return planner::optimizerRule(config.optimizer, p.muon).stateNames;
}

// One tensor per state name of parameter `p` (and its master when `master`), each holding `piece`.
void addPerParameter(StateFile& file, const planner::DeepSpeedConfig& config, const ParameterSpec& p,
                     std::vector<int64_t> shape, StatePiece piece, bool master) {
  if (master) file.tensors.push_back({"master." + p.name, "master", shape, {piece}});
  for (const std::string& state : stateNames(config, p)) file.tensors.push_back({p.name + "." + state, state, shape, {piece}});
}

// Where one rank stands in the layout: the parameters it holds (every dense one and, under expert
// parallelism, its own experts' only; indices into Plan::parameters) and its index in the groups
// its ZeRO partitions are cut over (dense parameters over dp x sp, experts over the
// expert-data-parallel group).
struct RankPlace {
  std::vector<int> held;
  int denseRank = 0, expertRank = 0;
  int expertIndex = 0;  // its place in its expert-parallel group: which experts it holds
};

void stage0(const planner::Plan& plan, const planner::DeepSpeedConfig& config, const RankPlace& place,
            StateFile& file) {
  const bool master = config.precision != planner::Precision::kFp32;
  for (int i : place.held) {
    const ParameterSpec& p = plan.parameters[i];
    if (!trains(p)) continue;
    addPerParameter(file, config, p, p.localShape, {.parameter = i, .length = p.localNumel()}, master);
  }
}

// The engine's partition: the dense blocks' buffers end to end, then (under expert parallelism)
// the experts' (worker/torch/zero/zero_stage12.cc).
void stage12(const planner::Plan& plan, const planner::DeepSpeedConfig& config, const RankPlace& place,
             StateFile& file) {
  StateTensor master{.name = "master.partition", .state = "master"};
  const bool muon = config.optimizer.type == planner::OptimizerType::kMuon;
  const bool expertDomain = plan.mesh.ep > 1;
  std::vector<StateTensor> perPiece;
  int64_t partOffset = 0;
  std::vector<const planner::FlatBufferSpec*> order;
  for (const auto& buffer : plan.zero.buffers)
    if (!(expertDomain && buffer.experts)) order.push_back(&buffer);
  for (const auto& buffer : plan.zero.buffers)
    if (expertDomain && buffer.experts) order.push_back(&buffer);
  for (const planner::FlatBufferSpec* buffer : order) {
    const int zeroRank = buffer->experts ? place.expertRank : place.denseRank;
    const std::vector<int>& members = buffer->members[buffer->experts ? place.expertIndex : 0];
    for (const planner::ZeroFragment& f : buffer->partition.fragments[zeroRank]) {
      const int parameter = members[f.parameter];
      const StatePiece piece{.parameter = parameter,
                             .offset = f.parameterOffset,
                             .length = f.length,
                             .at = partOffset + f.partitionOffset};
      master.pieces.push_back(piece);
      if (muon) {
        StateFile one;
        addPerParameter(one, config, plan.parameters[parameter], {f.length}, {piece.parameter, piece.offset, piece.length, 0},
                        false);
        for (auto& t : one.tensors) perPiece.push_back(std::move(t));
      }
    }
    partOffset += buffer->partition.partitionNumel;
  }
  master.shape = {partOffset};
  if (!muon) {
    for (const std::string& state : planner::optimizerRule(config.optimizer, false).stateNames)
      file.tensors.push_back({"partition." + state, state, master.shape, master.pieces});
  }
  file.tensors.push_back(std::move(master));
  for (auto& t : perPiece) file.tensors.push_back(std::move(t));
}

void stage3(const planner::Plan& plan, const planner::DeepSpeedConfig& config, const RankPlace& place,
            StateFile& file) {
  for (int i : place.held) {
    const ParameterSpec& p = plan.parameters[i];
    if (!trains(p)) continue;
    const int64_t numel = p.localNumel();
    const bool whole = p.persistent || p.partitionNumel == 0;
    const int64_t part = whole ? numel : p.partitionNumel;
    const int64_t offset = whole ? 0 : (p.expert >= 0 ? place.expertRank : place.denseRank) * part;
    const int64_t length = std::clamp<int64_t>(numel - offset, 0, part);
    std::vector<StatePiece> pieces;
    if (length > 0) pieces.push_back({.parameter = i, .offset = offset, .length = length});
    file.tensors.push_back({"master." + p.name, "master", {part}, pieces});
    for (const std::string& state : stateNames(config, p)) file.tensors.push_back({p.name + "." + state, state, {part}, pieces});
  }
}

}  // namespace

int64_t StateTensor::numel() const { return numelOf(shape); }

std::string rankFileName(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

bool statePerRank(int zeroStage, int tensorParallel, int expertParallel) {
  return zeroStage > 0 || tensorParallel > 1 || expertParallel > 1;
}

StatusOr<StateLayout> stateLayout(const planner::Plan& plan, const planner::DeepSpeedConfig& config) {
  const planner::PlanMesh& m = plan.mesh;
  ASSIGN_OR_RETURN(planner::Mesh mesh, planner::Mesh::create(m.world, m.tp, m.sp, m.ep));
  const int stage = config.zero.stage;
  StateLayout layout;
  layout.mastersAreWeights = stage == 0 && config.precision == planner::Precision::kFp32;
  auto indexIn = [&](planner::MeshAxis axis, int rank) {
    const std::vector<int> group = mesh.group(axis, rank);
    return static_cast<int>(std::find(group.begin(), group.end(), rank) - group.begin());
  };
  if (!statePerRank(stage, m.tp, m.ep)) {
    StateFile file{.file = "optimizer.safetensors", .rank = 0, .tpRank = 0};
    stage0(plan, config, RankPlace{.held = planner::parametersOfRank(plan, 0)}, file);
    layout.files.push_back(std::move(file));
    return layout;
  }
  for (int rank = 0; rank < m.world; ++rank) {
    StateFile file{.file = rankFileName(rank), .rank = rank, .tpRank = indexIn(planner::MeshAxis::kTensor, rank)};
    const RankPlace place{.held = planner::parametersOfRank(plan, rank),
                          .denseRank = indexIn(planner::MeshAxis::kDenseData, rank),
                          .expertRank = indexIn(planner::MeshAxis::kExpertData, rank),
                          .expertIndex = mesh.expertIndex(rank)};
    if (stage == 0) stage0(plan, config, place, file);
    if (stage == 1 || stage == 2) stage12(plan, config, place, file);
    if (stage == 3) stage3(plan, config, place, file);
    layout.files.push_back(std::move(file));
  }
  return layout;
}

}  // namespace loom::checkpoint
