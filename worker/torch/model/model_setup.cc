#include "worker/torch/model/model_setup.h"

#include <algorithm>
#include <thread>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#ifdef LOOM_HAVE_NCCL
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "common/files.h"

namespace loom::worker {

at::ScalarType modelDtype(planner::Precision precision) {
  switch (precision) {
    case planner::Precision::kBf16: return at::kBFloat16;
    case planner::Precision::kFp16: return at::kHalf;
    case planner::Precision::kFp32: return at::kFloat;
  }
  return at::kFloat;
}

at::Device rankDevice(const planner::JobSpec& spec, int localRank) {
  if (spec.device == planner::DeviceKind::kCuda) return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank));
  return at::kCPU;
}

void makeCurrent(const at::Device& device) {
#ifdef LOOM_HAVE_NCCL
  if (device.is_cuda() && at::hasCUDA()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

std::string deviceName(const at::Device& device) {
#ifdef LOOM_HAVE_NCCL
  if (device.is_cuda() && at::hasCUDA()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  (void)device;
  return "";
}

void releaseCachedMemory(const at::Device& device) {
#ifdef LOOM_HAVE_NCCL
  if (device.is_cuda() && at::hasCUDA()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  (void)device;
}

int64_t devicePeakBytes(const at::Device& device) {
#ifdef LOOM_HAVE_NCCL
  if (device.is_cuda() && at::hasCUDA()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#endif
  (void)device;
  return 0;
}

std::pair<int64_t, int64_t> deviceMemoryInfo(const at::Device& device) {
#ifdef LOOM_HAVE_NCCL
  if (device.is_cuda()) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) return {static_cast<int64_t>(free), static_cast<int64_t>(total)};
  }
#endif
  (void)device;
  return {0, 0};
}

void synchronize(const at::Device& device) {
#ifdef LOOM_HAVE_NCCL
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#else
  (void)device;
#endif
}

namespace {

// The model the worker built must be the one the Plan describes, parameter by parameter (its
// name, whole shape, this rank's piece and dtype): the Plan's layouts and partitions are trusted
// from here on.
Status checkAgainstPlan(const DecoderModel& model, const planner::Plan& plan) {
  const auto& params = model.parameters();
  if (params.size() != plan.parameters.size())
    return failedPrecondition("plan: the model has {} parameters, the Plan {} (was the Plan compiled from another "
                              "config.json?)",
                              params.size(), plan.parameters.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    const auto& spec = plan.parameters[i];
    const ShardLayout& layout = model.shards().layouts[i];
    const std::string dtype = t.scalar_type() == at::kBFloat16 ? "bfloat16"
                              : t.scalar_type() == at::kHalf   ? "float16"
                                                               : "float32";
    if (name != spec.name || layout.whole != spec.shape || t.sizes().vec() != spec.localShape || dtype != spec.dtype)
      return failedPrecondition("plan: parameter {} is {} {} (this rank {}) {} in the model and {} {} (each rank {}, "
                                "{} split) {} in the Plan",
                                i, name, c10::str(at::IntArrayRef(layout.whole)), c10::str(t.sizes()), dtype,
                                spec.name, c10::str(at::IntArrayRef(spec.shape)),
                                c10::str(at::IntArrayRef(spec.localShape)), planner::tpSplitName(spec.split),
                                spec.dtype);
  }
  return Status::ok();
}

ModelShards shardsOf(const planner::Plan& plan, const RankMesh& mesh) {
  ModelShards shards{.tp = mesh.tensor, .layouts = {}, .sp = mesh.sequence, .ep = mesh.expert};
  for (const auto& p : plan.parameters)
    shards.layouts.push_back(shardLayout(p, shards.tp->rank(), shards.tp->size()));
  return shards;
}

// train.frozen_parameters: autograd gives them no gradient, and the ZeRO engines leave
// parameters that do not require one out of the optimizer (trainableParameters()).
// expert_parallel (AutoEP) routes as its settings say, what they leave "auto" being the model's
// (the Plan's routing, resolved by the planner). DeepSpeed's route scale: routed_scaling_factor
// where the config or the model gives one, else route_scale.
void routeAsPlanned(planner::ModelConfig& config, const planner::ExpertRouting& r) {
  planner::RouterConfig& router = config.router;
  router.scoring = r.scoring;
  router.normalizeTopK = r.normalizeTopK;
  const bool modelScales = config.family == planner::ModelFamily::kDeepseekV3;
  router.scalingFactor = modelScales || r.routedScalingFactor != 1.0 ? r.routedScalingFactor : r.routeScale;
  router.groups = r.groups;
  router.groupsPerToken = r.groupsPerToken;
  config.expertsPerToken = r.topK;
  config.expertMlp = r.expertMlp;
}

void freezeParameters(DecoderModel& model, const planner::TrainSpec& train) {
  for (const auto& [name, t] : model.parameters())
    if (train.freezes(name)) t.requires_grad_(false);
}

}  // namespace

StatusOr<BuiltModel> buildModel(const planner::JobSpec& spec, const planner::Plan& plan, at::Device device,
                                const RankMesh& mesh) {
  BuiltModel built;
  auto text = files::readFile(spec.model.config);
  if (!text.isOk()) return text.status().withContext("model.config");
  built.configText = *text;
  auto config = planner::parseModelConfig(*text, spec.model.config);
  if (!config.isOk()) return config.status().withContext("model.config");
  if (plan.routing) routeAsPlanned(*config, *plan.routing);
  if (mesh.tensor->size() != plan.mesh.tp || mesh.sequence->size() != plan.mesh.sp ||
      mesh.expert->size() != plan.mesh.ep)
    return internalError("plan: tensor parallel {} x sequence parallel {}, expert parallel {}, but this rank's groups "
                         "have {}, {} and {} ranks",
                         plan.mesh.tp, plan.mesh.sp, plan.mesh.ep, mesh.tensor->size(), mesh.sequence->size(),
                         mesh.expert->size());
  if (device.is_cuda() && !at::hasCUDA())
    return failedPrecondition("resources.device: cuda, but this rank sees no CUDA device (or libtorch has no CUDA)");
  makeCurrent(device);
  ASSIGN_OR_RETURN(built.model, DecoderModel::create(*config, modelDtype(spec.deepspeed.precision), device,
                                                     shardsOf(plan, mesh)));
  RETURN_IF_ERROR(checkAgainstPlan(*built.model, plan));
  built.model->setLossBlockRows(spec.model.lossBlockRows);
  const planner::ActivationCheckpointingConfig& checkpointing = spec.deepspeed.activationCheckpointing;
  built.model->setActivationCheckpointing(ActivationCheckpointing{
      .enabled = checkpointing.enabled || spec.train.gradientCheckpointing,
      .layers = checkpointing.numberCheckpoints ? checkpointing.numberCheckpoints : -1,
      .toHost = checkpointing.cpuCheckpointing});
  if (spec.model.weights.empty()) {
    built.model->initRandom(spec.model.initSeed);
    freezeParameters(*built.model, spec.train);
    return built;
  }
  auto weights = loadSafetensors(spec.model.weights);
  if (!weights.isOk()) return weights.status().withContext("model.weights");
  RETURN_IF_ERROR(built.model->loadWeights(*weights, spec.model.weights).withContext("model.weights"));
  freezeParameters(*built.model, spec.train);
  return built;
}

void setThreadsForRanks(int localWorldSize) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(std::max(1, cores / std::max(1, localWorldSize)));
}

}  // namespace loom::worker
