#include "planner/plan_compiler.h"

#include <algorithm>

#include <fmt/format.h>

#include "planner/mesh.h"
#include "planner/model_parameters.h"
#include "planner/optimizer_rules.h"

namespace loom::planner {

namespace {

const char* dtypeOf(Precision precision) {
  switch (precision) {
    case Precision::kBf16: return "bfloat16";
    case Precision::kFp16: return "float16";
    case Precision::kFp32: return "float32";
  }
  return "float32";
}

PlanGroups groupsOf(const Mesh& mesh) {
  return PlanGroups{.tensor = mesh.groups(MeshAxis::kTensor),
                    .sequence = mesh.groups(MeshAxis::kSequence),
                    .data = mesh.groups(MeshAxis::kData),
                    .denseData = mesh.groups(MeshAxis::kDenseData),
                    .expert = mesh.groups(MeshAxis::kExpert),
                    .expertData = mesh.groups(MeshAxis::kExpertData)};
}

// The layout in words, where the shapes do not say it all.
std::string layoutNote(const ModelConfig& c, const ParameterSpec& p, int tp) {
  if (p.split == TpSplit::kReplicated)
    return p.gradAllreduce ? "whole; its gradient is summed over the tensor-parallel group" : "";
  if (tp == 1) return "";
  std::string note;
  const int64_t local = p.localShape[p.splitDim], whole = p.shape[p.splitDim];
  switch (p.role) {
    case LayerRole::kEmbedding:
    case LayerRole::kHead:
      note = fmt::format("vocabulary-parallel: {} of {} rows per rank", local, whole);
      break;
    case LayerRole::kQuery:
      note = fmt::format("{} of {} query heads per rank", c.numHeads / tp, c.numHeads);
      break;
    case LayerRole::kKey:
    case LayerRole::kValue:
      note = p.kvReplication > 1 ? fmt::format("GQA: {} KV heads over {} ranks, each on {} ranks", c.numKvHeads, tp,
                                               p.kvReplication)
                                 : fmt::format("GQA: {} of {} KV heads per rank, with their query heads",
                                               c.numKvHeads / tp, c.numKvHeads);
      break;
    case LayerRole::kKeyValue:
      note = fmt::format("keys and values of {} of {} heads per rank", c.numHeads / tp, c.numHeads);
      break;
    case LayerRole::kAttentionOutput:
    case LayerRole::kDown:
      note = fmt::format("{} of {} input features per rank; outputs summed over the group", local, whole);
      break;
    default:
      note = fmt::format("{} of {} {} per rank", local, whole, p.splitDim == 0 ? "output features" : "input features");
  }
  if (!p.subParams.empty()) note += fmt::format("; {} packed sub-parameters, each split", p.subParams.size());
  if (p.gatherOutput) note += "; output all-gathered";
  return note;
}

// ZeRO stage 3: every trainable parameter partitioned on its own over its group (dense over
// dp x sp, experts over the expert-data-parallel group), small ones persistent.
void partitionStage3(const ZeroConfig& zero, const PlanMesh& mesh, std::vector<ParameterSpec>& params) {
  for (bool experts : {false, true}) {
    std::vector<int> members;
    std::vector<int64_t> numels;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable || (params[i].expert >= 0) != experts) continue;
      members.push_back(static_cast<int>(i));
      numels.push_back(params[i].localNumel());
    }
    const auto parts = partitionPerParameter(numels, experts ? mesh.expertData() : mesh.denseData(),
                                             zero.paramPersistenceThreshold, zero.modelPersistenceThreshold);
    for (size_t k = 0; k < members.size(); ++k) {
      params[members[k]].persistent = parts[k].persistent;
      params[members[k]].partitionNumel = parts[k].partitionNumel;
    }
  }
}

// ZeRO stages 1 and 2: a flat buffer per block, and one per block for its experts.
std::vector<FlatBufferSpec> partitionBlocks(const PlanMesh& mesh, int64_t numLayers,
                                            const std::vector<ParameterSpec>& params) {
  const int64_t blocks = numLayers + 2;
  std::vector<std::vector<int>> dense(blocks), experts(blocks);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParameterSpec& p = params[i];
    if (!p.trainable || p.frozen) continue;
    const int64_t block = p.layer >= 0 ? p.layer + 1 : (p.role == LayerRole::kEmbedding ? 0 : blocks - 1);
    (p.expert >= 0 ? experts : dense)[block].push_back(static_cast<int>(i));
  }
  std::vector<FlatBufferSpec> out;
  auto numelsOf = [&](const std::vector<int>& members) {
    std::vector<int64_t> numels;
    for (int i : members) numels.push_back(params[i].localNumel());
    return numels;
  };
  for (int64_t b = 0; b < blocks; ++b) {
    if (!dense[b].empty()) {
      FlatBufferSpec buffer{.block = static_cast<int>(b), .experts = false, .groupSize = mesh.denseData(),
                            .members = {dense[b]}, .partition = {}};
      buffer.partition = partitionFlat(numelsOf(dense[b]), buffer.groupSize);
      out.push_back(std::move(buffer));
    }
    if (!experts[b].empty()) {
      FlatBufferSpec buffer{.block = static_cast<int>(b), .experts = true, .groupSize = mesh.expertData(),
                            .members = std::vector<std::vector<int>>(mesh.ep), .partition = {}};
      for (int i : experts[b]) buffer.members[params[i].expertOwner].push_back(i);
      buffer.partition = partitionFlat(numelsOf(buffer.members[0]), buffer.groupSize);
      out.push_back(std::move(buffer));
    }
  }
  return out;
}

// Stages 1-2 cut a layer's experts as one flat buffer per expert-parallel rank with one partition
// for all of them: each rank's trained experts must be alike, which frozen experts can break.
Status checkExpertBuffersAlike(const Plan& plan) {
  for (const FlatBufferSpec& buffer : plan.zero.buffers) {
    if (!buffer.experts) continue;
    auto numels = [&](const std::vector<int>& members) {
      std::vector<int64_t> out;
      for (int i : members) out.push_back(plan.parameters[i].localNumel());
      return out;
    };
    for (size_t e = 1; e < buffer.members.size(); ++e) {
      if (numels(buffer.members[e]) != numels(buffer.members[0]))
        return invalidArgument("train.frozen_parameters: at ZeRO stage {} under expert parallelism, layer {}'s experts "
                               "are frozen unevenly over the expert-parallel ranks (expert-parallel rank 0 trains {} of "
                               "its tensors, expert-parallel rank {} trains {}): freeze the same tensors of every "
                               "rank's experts, or use stage 0 or 3",
                               plan.zero.stage, buffer.block - 1, buffer.members[0].size(), e,
                               buffer.members[e].size());
    }
  }
  return Status::ok();
}

// Each train.frozen_parameters pattern must hold a parameter (a typo would silently train what
// was meant to stay fixed), and something must be left to train.
Status checkFrozenParameters(const TrainSpec& train, const std::vector<ParameterInfo>& parameters) {
  if (train.frozenParameters.empty()) return Status::ok();
  size_t frozen = 0;
  for (const ParameterInfo& p : parameters) frozen += train.freezes(p.name) ? 1 : 0;
  for (size_t i = 0; i < train.frozenParameters.size(); ++i) {
    TrainSpec one;
    one.frozenParameters = {train.frozenParameters[i]};
    const bool matches = std::any_of(parameters.begin(), parameters.end(),
                                     [&](const ParameterInfo& p) { return one.freezes(p.name); });
    if (!matches)
      return invalidArgument("train.frozen_parameters[{}]: \"{}\" matches no parameter of the model (names look like "
                             "{})",
                             i, train.frozenParameters[i], parameters.size() > 1 ? parameters[1].name : "?");
  }
  if (frozen == parameters.size())
    return invalidArgument("train.frozen_parameters: every one of the model's {} parameters is frozen", frozen);
  return Status::ok();
}

// The decoder layers recomputed in backward: activation_checkpointing (its number_checkpoints
// the first so many) or train.gradient_checkpointing, every layer.
int64_t checkpointedLayers(const DeepSpeedConfig& ds, const JobSpec& spec, const ModelConfig& model) {
  const ActivationCheckpointingConfig& a = ds.activationCheckpointing;
  if (!a.enabled && !spec.train.gradientCheckpointing) return 0;
  return a.numberCheckpoints ? std::min(a.numberCheckpoints, model.numLayers) : model.numLayers;
}

}  // namespace

Status checkPlanRunnable(const Plan& plan) {
  if (plan.mesh.tp == 1) return Status::ok();
  for (const ParameterSpec& p : plan.parameters) {
    const bool bias = p.shape.size() == 1;
    TpSplit expected = TpSplit::kReplicated;
    int dim = -1;
    switch (p.role) {
      case LayerRole::kEmbedding:
      case LayerRole::kHead:
        expected = TpSplit::kVocab, dim = 0;
        break;
      case LayerRole::kQuery:
      case LayerRole::kKey:
      case LayerRole::kValue:
      case LayerRole::kKeyValue:  // latent attention's kv_b_proj, by heads
      case LayerRole::kGate:
      case LayerRole::kUp:
        expected = TpSplit::kColumn, dim = 0;
        break;
      case LayerRole::kAttentionOutput:
      case LayerRole::kDown:
        if (!bias) expected = TpSplit::kRow, dim = 1;
        break;
      default:
        break;
    }
    const bool matches = p.split == expected && p.splitDim == dim && p.subParams.empty() && !p.gatherOutput &&
                         !p.gradAllreduce;
    if (!matches)
      return invalidArgument("deepspeed.tensor_parallel.partition_config.layer_specs: {} is laid out {} (dimension {}{}{}"
                             "{}); the workers run a {} decoder's {} {} (dimension {}), AutoTP's default layout: a "
                             "layer spec that changes it is planned (loomctl plan) but not run",
                             p.name, tpSplitName(p.split), p.splitDim, p.subParams.empty() ? "" : ", packed sub-parameters",
                             p.gatherOutput ? ", output gathered" : "", p.gradAllreduce ? ", gradient all-reduced" : "",
                             plan.modelFamily, layerRoleName(p.role), tpSplitName(expected), dim);
  }
  return Status::ok();
}

Status checkHasPlan(const JobSpec& spec) {
  if (jobKindInfo(spec.kind).hasPlan) return Status::ok();
  return invalidArgument("kind: a {} job has no plan (train, eval and rollout jobs do)", jobKindName(spec.kind));
}

StatusOr<Plan> compilePlan(const ModelConfig& model, const JobSpec& spec) {
  RETURN_IF_ERROR(checkHasPlan(spec));
  const DeepSpeedConfig& ds = spec.deepspeed;
  const int tp = ds.tensorParallel.ranks(), sp = ds.sequenceParallelSize, ep = ds.expertParallel.ranks();

  Plan plan;
  plan.jobName = spec.name;
  plan.modelFamily = modelFamilyName(model.family);
  plan.training = spec.kind == JobKind::kTrain;
  plan.precision = ds.precision;
  // A rollout step computes up to max_num_batched_tokens tokens: its activations are those of one
  // sample that long.
  const bool rollout = spec.kind == JobKind::kRollout;
  const int64_t sequenceLength = rollout ? spec.rollout.maxNumBatchedTokens : spec.data.seqLen;
  const int64_t microBatch = rollout ? 1 : ds.microBatchSize;
  plan.microBatch = microBatch;
  plan.sequenceLength = sequenceLength;
  plan.deviceMemoryBytes = spec.deviceMemoryBytes();

  if (rollout && model.isMla())
    return invalidArgument("model.config: a rollout of {}'s multi-head latent attention is not built yet (its KV "
                           "cache would hold the latents)",
                           plan.modelFamily);
  ASSIGN_OR_RETURN(Mesh mesh, Mesh::create(spec.ranks, tp, sp, ep));
  plan.mesh = PlanMesh{.world = mesh.world(), .dp = mesh.dp(), .sp = mesh.sp(), .tp = mesh.tp(), .ep = mesh.ep()};
  const auto parameters = enumerateParameters(model);
  RETURN_IF_ERROR(checkFrozenParameters(spec.train, parameters));
  ASSIGN_OR_RETURN(auto layouts, layoutTensorParallel(model, parameters, ds.tensorParallel));
  RETURN_IF_ERROR(checkSequenceParallel(model, sp, sequenceLength, tp));
  RETURN_IF_ERROR(checkExpertParallel(model, ep));
  if (ds.expertParallel.enabled) {
    ASSIGN_OR_RETURN(plan.routing, resolveRouting(model, ds.expertParallel));
  }

  const ZeroConfig zero = ds.zero.sizedFor(model.hiddenSize);
  // Frozen parameters hold their weights only: no gradient, no master, no optimizer state (ZeRO-3
  // still partitions them, as it does every weight).
  std::vector<ParameterInfo> held = parameters;
  for (ParameterInfo& p : held)
    if (spec.train.freezes(p.name)) p.trainable = false;
  plan.memory = estimateMemory(model, held, layouts,
                               TrainingShape{.zeroStage = zero.stage,
                                             .dataParallel = plan.mesh.denseData(),
                                             .expertParallel = ep,
                                             .tensorParallel = tp,
                                             .sequenceParallel = sp,
                                             .precision = ds.precision,
                                             .optimizerStates = optimizerStatesPerElement(ds.optimizer, held),
                                             .offloadOptimizer = zero.offloadOptimizer == "cpu",
                                             .offloadParameters = zero.offloadParam == "cpu",
                                             .training = plan.training,
                                             .microBatch = microBatch,
                                             .sequenceLength = sequenceLength,
                                             .reduceBucketElements = zero.reduceBucketSize,
                                             .persistenceThreshold = zero.paramPersistenceThreshold,
                                             .prefetchBucketElements = zero.prefetchBucketSize,
                                             .checkpointedLayers = checkpointedLayers(ds, spec, model),
                                             .checkpointsOnHost = ds.activationCheckpointing.cpuCheckpointing});
  if (plan.deviceMemoryBytes > 0)
    RETURN_IF_ERROR(checkFits(plan.memory, plan.deviceMemoryBytes)
                        .withContext(fmt::format("resources.device_memory_gb {}", spec.deviceMemoryGb)));
  plan.groups = groupsOf(mesh);

  plan.parameters.reserve(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ParameterInfo& info = parameters[i];
    const TpLayout& layout = layouts[i];
    ParameterSpec p{.name = info.name,
                    .shape = info.shape,
                    // HF keeps deepseek_v3's correction bias in fp32 whatever the model's dtype.
                    .dtype = info.trainable ? dtypeOf(ds.precision) : "float32",
                    .trainable = info.trainable,
                    .frozen = plan.training && spec.train.freezes(info.name),
                    .role = layerRole(info),
                    .layer = info.layer,
                    .split = layout.split,
                    .splitDim = layout.splitDim,
                    .localShape = layout.localShape,
                    .kvReplication = layout.kvReplication,
                    .subParams = layout.subParams,
                    .gatherOutput = layout.gatherOutput,
                    .gradAllreduce = layout.gradAllreduce,
                    .layout = {},
                    .tiedTo = {},
                    .expert = info.expert,
                    .expertOwner = info.expert >= 0 ? expertOwner(info.expert, model.numExperts, ep) : -1,
                    .muon = false,
                    .muonHeadDim = 0,
                    .persistent = false,
                    .partitionNumel = 0};
    if (p.expert < 0) p.layout = layoutNote(model, p, tp);
    if (p.role == LayerRole::kEmbedding && model.tieWordEmbeddings) {
      p.tiedTo = "lm_head.weight";
      p.layout += std::string(p.layout.empty() ? "" : "; ") + "tied: also the LM head";
    }
    plan.parameters.push_back(std::move(p));
  }

  if (plan.training) RETURN_IF_ERROR(tagMuonParameters(ds.optimizer, model, plan.parameters));

  plan.zero = ZeroPlan{.stage = zero.stage,
                       .denseGroupSize = plan.mesh.denseData(),
                       .expertGroupSize = plan.mesh.expertData(),
                       .persistenceThreshold = zero.paramPersistenceThreshold,
                       .modelPersistenceThreshold = zero.modelPersistenceThreshold,
                       .offloadOptimizer = zero.offloadOptimizer == "cpu",
                       .buffers = {}};
  if (zero.stage == 3) {
    partitionStage3(zero, plan.mesh, plan.parameters);
  } else if (zero.stage >= 1) {
    plan.zero.buffers = partitionBlocks(plan.mesh, model.numLayers, plan.parameters);
    RETURN_IF_ERROR(checkExpertBuffersAlike(plan));
  }

  return plan;
}

}  // namespace loom::planner
