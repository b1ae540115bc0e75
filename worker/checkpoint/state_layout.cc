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

void stage0(const planner::Plan& plan, const planner::DeepSpeedConfig& config, StateFile& file) {
  const bool master = config.precision != planner::Precision::kFp32;
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const ParameterSpec& p = plan.parameters[i];
    if (!trains(p)) continue;
    addPerParameter(file, config, p, p.localShape, {.parameter = static_cast<int>(i), .length = p.localNumel()}, master);
  }
}

void stage12(const planner::Plan& plan, const planner::DeepSpeedConfig& config, int zeroRank, StateFile& file) {
  StateTensor master{.name = "master.partition", .state = "master"};
  const bool muon = config.optimizer.type == planner::OptimizerType::kMuon;
  std::vector<StateTensor> perPiece;
  int64_t partOffset = 0;
  for (const planner::FlatBufferSpec& buffer : plan.zero.buffers) {
    for (const planner::ZeroFragment& f : buffer.partition.fragments[zeroRank]) {
      const int parameter = buffer.members[0][f.parameter];
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
    partOffset += buffer.partition.partitionNumel;
  }
  master.shape = {partOffset};
  if (!muon) {
    for (const std::string& state : planner::optimizerRule(config.optimizer, false).stateNames)
      file.tensors.push_back({"partition." + state, state, master.shape, master.pieces});
  }
  file.tensors.push_back(std::move(master));
  for (auto& t : perPiece) file.tensors.push_back(std::move(t));
}

void stage3(const planner::Plan& plan, const planner::DeepSpeedConfig& config, int zeroRank, StateFile& file) {
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const ParameterSpec& p = plan.parameters[i];
    if (!trains(p)) continue;
    const int64_t numel = p.localNumel();
    const bool whole = p.persistent || p.partitionNumel == 0;
    const int64_t part = whole ? numel : p.partitionNumel;
    const int64_t offset = whole ? 0 : zeroRank * part;
    const int64_t length = std::clamp<int64_t>(numel - offset, 0, part);
    std::vector<StatePiece> pieces;
    if (length > 0) pieces.push_back({.parameter = static_cast<int>(i), .offset = offset, .length = length});
    file.tensors.push_back({"master." + p.name, "master", {part}, pieces});
    for (const std::string& state : stateNames(config, p)) file.tensors.push_back({p.name + "." + state, state, {part}, pieces});
  }
}

}  // namespace

int64_t StateTensor::numel() const { return numelOf(shape); }

std::string rankFileName(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

bool statePerRank(int zeroStage, int tensorParallel) { return zeroStage > 0 || tensorParallel > 1; }

StatusOr<StateLayout> stateLayout(const planner::Plan& plan, const planner::DeepSpeedConfig& config) {
  const planner::PlanMesh& m = plan.mesh;
  if (m.ep > 1)
    return Status(StatusCode::kUnimplemented,
                  fmt::format("expert parallelism (ep {}): its checkpoints have no state layout yet", m.ep));
  ASSIGN_OR_RETURN(planner::Mesh mesh, planner::Mesh::create(m.world, m.tp, m.sp, m.ep));
  const int stage = config.zero.stage;
  StateLayout layout;
  layout.mastersAreWeights = stage == 0 && config.precision == planner::Precision::kFp32;
  if (!statePerRank(stage, m.tp)) {
    StateFile file{.file = "optimizer.safetensors", .rank = 0, .tpRank = 0};
    stage0(plan, config, file);
    layout.files.push_back(std::move(file));
    return layout;
  }
  for (int rank = 0; rank < m.world; ++rank) {
    const std::vector<int> tensorGroup = mesh.group(planner::MeshAxis::kTensor, rank);
    const std::vector<int> zeroGroup = mesh.group(planner::MeshAxis::kDenseData, rank);
    StateFile file{.file = rankFileName(rank),
                   .rank = rank,
                   .tpRank = static_cast<int>(std::find(tensorGroup.begin(), tensorGroup.end(), rank) - tensorGroup.begin())};
    const int zeroRank = static_cast<int>(std::find(zeroGroup.begin(), zeroGroup.end(), rank) - zeroGroup.begin());
    if (stage == 0) stage0(plan, config, file);
    if (stage == 1 || stage == 2) stage12(plan, config, zeroRank, file);
    if (stage == 3) stage3(plan, config, zeroRank, file);
    layout.files.push_back(std::move(file));
  }
  return layout;
}

}  // namespace loom::checkpoint
