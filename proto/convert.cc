#include "proto/convert.h"

namespace loom::convert {

grpc::Status toGrpc(const Status& status) {
  // Not grpc::Status::OK, a symbol of libgrpc++: libloom_worker_proto.so converts plans with this
  // file and links no gRPC (worker/plan_file.h).
  if (status.isOk()) return grpc::Status();
  return {static_cast<grpc::StatusCode>(status.code()), status.message()};
}

Status fromGrpc(const grpc::Status& status) {
  if (status.ok()) return Status::ok();
  return {static_cast<StatusCode>(status.error_code()), status.error_message()};
}

namespace {

v1::RankEvent eventToProto(RankEvent e) {
  switch (e) {
    case RankEvent::kStarted: return v1::RANK_STARTED;
    case RankEvent::kReady: return v1::RANK_READY;
    case RankEvent::kProgress: return v1::RANK_PROGRESS;
    case RankEvent::kExited: return v1::RANK_EXITED;
    case RankEvent::kHeartbeatLost: return v1::RANK_HEARTBEAT_LOST;
    case RankEvent::kLaunchFailed: return v1::RANK_LAUNCH_FAILED;
  }
  return v1::RANK_EVENT_UNSPECIFIED;
}

RankEvent eventFromProto(v1::RankEvent e) {
  switch (e) {
    case v1::RANK_READY: return RankEvent::kReady;
    case v1::RANK_PROGRESS: return RankEvent::kProgress;
    case v1::RANK_EXITED: return RankEvent::kExited;
    case v1::RANK_HEARTBEAT_LOST: return RankEvent::kHeartbeatLost;
    case v1::RANK_LAUNCH_FAILED: return RankEvent::kLaunchFailed;
    default: return RankEvent::kStarted;
  }
}

}  // namespace

v1::RankReport toProto(const RankReport& in) {
  v1::RankReport out;
  out.set_job_id(in.jobId);
  out.set_attempt(in.attempt);
  out.set_rank(in.rank);
  out.set_event(eventToProto(in.event));
  out.set_pid(in.pid);
  out.set_exit_code(in.exitCode);
  out.set_signal(in.signal);
  out.set_detail(in.detail);
  out.set_step(in.step);
  for (const auto& [k, v] : in.metrics) (*out.mutable_metrics())[k] = v;
  out.set_time_ms(in.timeMs);
  out.set_service_address(in.serviceAddress);
  return out;
}

RankReport fromProto(const v1::RankReport& in) {
  RankReport out{.jobId = in.job_id(), .attempt = in.attempt(), .rank = in.rank(), .event = eventFromProto(in.event()),
                 .pid = in.pid(), .exitCode = in.exit_code(), .signal = in.signal(), .detail = in.detail(),
                 .step = in.step(), .metrics = {}, .timeMs = in.time_ms(), .serviceAddress = in.service_address()};
  for (const auto& [k, v] : in.metrics()) out.metrics[k] = v;
  return out;
}

v1::Register toProto(const NodeRegistration& in) {
  v1::Register out;
  out.set_node_id(in.nodeId);
  out.set_hostname(in.hostname);
  out.set_address(in.address);
  out.set_slots(in.slots);
  for (const auto& r : in.ranks) *out.add_ranks() = toProto(r);
  out.set_instance_id(in.instanceId);
  out.set_gpus(in.gpus);
  return out;
}

NodeRegistration fromProto(const v1::Register& in) {
  NodeRegistration out{.nodeId = in.node_id(), .hostname = in.hostname(), .address = in.address(), .slots = in.slots(),
                       .ranks = {}, .instanceId = in.instance_id(), .gpus = in.gpus()};
  for (const auto& r : in.ranks()) out.ranks.push_back(fromProto(r));
  return out;
}

v1::MasterEndpoint toProto(const MasterEndpoint& in) {
  v1::MasterEndpoint out;
  out.set_job_id(in.jobId);
  out.set_attempt(in.attempt);
  out.set_address(in.address);
  out.set_port(in.port);
  return out;
}

MasterEndpoint fromProto(const v1::MasterEndpoint& in) {
  return {.jobId = in.job_id(), .attempt = in.attempt(), .address = in.address(), .port = in.port()};
}

v1::LogData toProto(const LogData& in) {
  v1::LogData out;
  out.set_request_id(in.requestId);
  out.set_rank(in.rank);
  out.set_data(in.data);
  out.set_done(in.done);
  out.set_error(in.error);
  return out;
}

LogData fromProto(const v1::LogData& in) {
  return {.requestId = in.request_id(), .rank = in.rank(), .data = in.data(), .done = in.done(), .error = in.error()};
}

v1::Launch toProto(const LaunchOrder& in) {
  v1::Launch out;
  out.set_job_id(in.jobId);
  out.set_attempt(in.attempt);
  out.set_spec_json(in.specJson);
  out.set_plan(in.plan);
  out.set_service_token(in.serviceToken);
  out.set_service_certificate(in.serviceCertificate.certificate);
  out.set_service_key(in.serviceCertificate.privateKey);
  for (const auto& r : in.ranks) {
    auto* a = out.add_ranks();
    a->set_rank(r.rank);
    a->set_local_rank(r.localRank);
  }
  out.set_world_size(in.worldSize);
  out.set_local_world_size(in.localWorldSize);
  out.set_master_addr(in.masterAddr);
  out.set_master_port(in.masterPort);
  out.set_pick_master_port(in.pickMasterPort);
  out.set_heartbeat_timeout_ms(in.heartbeatTimeoutMs);
  out.set_grace_period_ms(in.gracePeriodMs);
  out.set_group_rank(in.groupRank);
  return out;
}

LaunchOrder fromProto(const v1::Launch& in) {
  LaunchOrder out{.jobId = in.job_id(), .attempt = in.attempt(), .specJson = in.spec_json(), .ranks = {},
                  .worldSize = in.world_size(), .localWorldSize = in.local_world_size(),
                  .masterAddr = in.master_addr(), .masterPort = in.master_port(),
                  .pickMasterPort = in.pick_master_port(), .heartbeatTimeoutMs = in.heartbeat_timeout_ms(),
                  .gracePeriodMs = in.grace_period_ms(), .groupRank = in.group_rank(), .plan = in.plan(),
                  .serviceToken = in.service_token(),
                  .serviceCertificate = {.certificate = in.service_certificate(), .privateKey = in.service_key()}};
  for (const auto& r : in.ranks()) out.ranks.push_back({.rank = r.rank(), .localRank = r.local_rank()});
  return out;
}

v1::Kill toProto(const KillOrder& in) {
  v1::Kill out;
  out.set_job_id(in.jobId);
  out.set_attempt(in.attempt);
  out.set_grace_period_ms(in.gracePeriodMs);
  out.set_reason(in.reason);
  out.set_preempt(in.preempt);
  return out;
}

KillOrder fromProto(const v1::Kill& in) {
  return {.jobId = in.job_id(), .attempt = in.attempt(), .gracePeriodMs = in.grace_period_ms(), .reason = in.reason(),
          .preempt = in.preempt()};
}

v1::Release toProto(const ReleaseOrder& in) {
  v1::Release out;
  out.set_job_id(in.jobId);
  out.set_attempt(in.attempt);
  return out;
}

ReleaseOrder fromProto(const v1::Release& in) { return {.jobId = in.job_id(), .attempt = in.attempt()}; }

v1::LogRequest toProto(const LogQuery& in) {
  v1::LogRequest out;
  out.set_request_id(in.requestId);
  out.set_job_id(in.jobId);
  out.set_attempt(in.attempt);
  for (int r : in.ranks) out.add_ranks(r);
  out.set_tail_lines(in.tailLines);
  out.set_follow(in.follow);
  return out;
}

LogQuery fromProto(const v1::LogRequest& in) {
  LogQuery out{.requestId = in.request_id(), .jobId = in.job_id(), .attempt = in.attempt(), .ranks = {},
               .tailLines = in.tail_lines(), .follow = in.follow()};
  for (int r : in.ranks()) out.ranks.push_back(r);
  return out;
}

}  // namespace loom::convert

// ---- the Plan ---------------------------------------------------------------------------------

namespace loom::convert {

namespace {

using planner::LayerRole;
using planner::Precision;
using planner::ExpertMlpConfig;
using planner::RouterConfig;
using planner::TpSplit;

v1::TpSplit splitToProto(TpSplit s) {
  switch (s) {
    case TpSplit::kReplicated: return v1::TP_REPLICATED;
    case TpSplit::kColumn: return v1::TP_COLUMN;
    case TpSplit::kRow: return v1::TP_ROW;
    case TpSplit::kVocab: return v1::TP_VOCAB;
  }
  return v1::TP_SPLIT_UNSPECIFIED;
}

TpSplit splitFromProto(v1::TpSplit s) {
  switch (s) {
    case v1::TP_COLUMN: return TpSplit::kColumn;
    case v1::TP_ROW: return TpSplit::kRow;
    case v1::TP_VOCAB: return TpSplit::kVocab;
    default: return TpSplit::kReplicated;
  }
}

LayerRole roleFromName(const std::string& name) {
  for (int r = static_cast<int>(LayerRole::kEmbedding); r <= static_cast<int>(LayerRole::kOther); ++r) {
    if (name == planner::layerRoleName(static_cast<LayerRole>(r))) return static_cast<LayerRole>(r);
  }
  return LayerRole::kOther;
}

Precision precisionFromName(const std::string& name) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    if (name == planner::precisionName(p)) return p;
  }
  return Precision::kFp32;
}

template <typename T>
std::vector<T> toVector(const google::protobuf::RepeatedField<T>& in) {
  return std::vector<T>(in.begin(), in.end());
}

void groupsToProto(const planner::RankGroups& in, google::protobuf::RepeatedPtrField<v1::RankGroup>* out) {
  out->Reserve(static_cast<int>(in.size()));
  for (const auto& g : in) *out->Add()->mutable_ranks() = {g.begin(), g.end()};
}

planner::RankGroups groupsFromProto(const google::protobuf::RepeatedPtrField<v1::RankGroup>& in) {
  planner::RankGroups out;
  out.reserve(in.size());
  for (const auto& g : in) out.push_back(toVector(g.ranks()));
  return out;
}

void parameterToProto(const planner::ParameterSpec& p, v1::ParameterSpec* out) {
  out->set_name(p.name);
  *out->mutable_shape() = {p.shape.begin(), p.shape.end()};
  out->set_dtype(p.dtype);
  out->set_trainable(p.trainable);
  out->set_role(planner::layerRoleName(p.role));
  out->set_layer(p.layer);
  out->set_split(splitToProto(p.split));
  out->set_split_dim(p.splitDim);
  *out->mutable_local_shape() = {p.localShape.begin(), p.localShape.end()};
  out->set_kv_replication(p.kvReplication);
  *out->mutable_sub_params() = {p.subParams.begin(), p.subParams.end()};
  out->set_gather_output(p.gatherOutput);
  out->set_grad_allreduce(p.gradAllreduce);
  out->set_layout(p.layout);
  out->set_tied_to(p.tiedTo);
  out->set_expert(p.expert);
  out->set_expert_owner(p.expertOwner);
  out->set_persistent(p.persistent);
  out->set_partition_numel(p.partitionNumel);
  out->set_frozen(p.frozen);
  out->set_muon(p.muon);
  out->set_muon_head_dim(p.muonHeadDim);
}

planner::ParameterSpec parameterFromProto(const v1::ParameterSpec& p) {
  return planner::ParameterSpec{.name = p.name(),
                                .shape = toVector(p.shape()),
                                .dtype = p.dtype(),
                                .trainable = p.trainable(),
                                .frozen = p.frozen(),
                                .role = roleFromName(p.role()),
                                .layer = p.layer(),
                                .split = splitFromProto(p.split()),
                                .splitDim = p.split_dim(),
                                .localShape = toVector(p.local_shape()),
                                .kvReplication = p.kv_replication(),
                                .subParams = toVector(p.sub_params()),
                                .gatherOutput = p.gather_output(),
                                .gradAllreduce = p.grad_allreduce(),
                                .layout = p.layout(),
                                .tiedTo = p.tied_to(),
                                .expert = p.expert(),
                                .expertOwner = p.expert_owner(),
                                .muon = p.muon(),
                                .muonHeadDim = p.muon_head_dim(),
                                .persistent = p.persistent(),
                                .partitionNumel = p.partition_numel()};
}

void bufferToProto(const planner::FlatBufferSpec& b, v1::FlatBuffer* out) {
  out->set_block(b.block);
  out->set_experts(b.experts);
  out->set_group_size(b.groupSize);
  for (const auto& m : b.members) *out->add_members()->mutable_parameters() = {m.begin(), m.end()};
  out->set_flat_numel(b.partition.flatNumel);
  out->set_partition_numel(b.partition.partitionNumel);
  out->set_padding(b.partition.padding);
  for (const auto& rank : b.partition.fragments) {
    auto* fragments = out->add_fragments();
    for (const auto& f : rank) {
      auto* o = fragments->add_fragments();
      o->set_parameter(f.parameter);
      o->set_parameter_offset(f.parameterOffset);
      o->set_length(f.length);
      o->set_partition_offset(f.partitionOffset);
    }
  }
}

planner::FlatBufferSpec bufferFromProto(const v1::FlatBuffer& b) {
  planner::FlatBufferSpec out{.block = b.block(), .experts = b.experts(), .groupSize = b.group_size(), .members = {},
                              .partition = {}};
  for (const auto& m : b.members()) out.members.push_back(toVector(m.parameters()));
  out.partition.flatNumel = b.flat_numel();
  out.partition.partitionNumel = b.partition_numel();
  out.partition.padding = b.padding();
  for (const auto& rank : b.fragments()) {
    auto& fragments = out.partition.fragments.emplace_back();
    for (const auto& f : rank.fragments()) {
      fragments.push_back(planner::ZeroFragment{.parameter = f.parameter(), .parameterOffset = f.parameter_offset(),
                                                .length = f.length(), .partitionOffset = f.partition_offset()});
    }
  }
  return out;
}

}  // namespace

v1::Plan toProto(const planner::Plan& in) {
  v1::Plan out;
  out.set_job_name(in.jobName);
  out.set_model_family(in.modelFamily);
  out.set_training(in.training);
  out.set_precision(planner::precisionName(in.precision));
  out.set_micro_batch(in.microBatch);
  out.set_sequence_length(in.sequenceLength);
  auto* mesh = out.mutable_mesh();
  mesh->set_world(in.mesh.world);
  mesh->set_dp(in.mesh.dp);
  mesh->set_sp(in.mesh.sp);
  mesh->set_tp(in.mesh.tp);
  mesh->set_ep(in.mesh.ep);
  auto* groups = out.mutable_groups();
  groupsToProto(in.groups.tensor, groups->mutable_tensor());
  groupsToProto(in.groups.sequence, groups->mutable_sequence());
  groupsToProto(in.groups.data, groups->mutable_data());
  groupsToProto(in.groups.denseData, groups->mutable_dense_data());
  groupsToProto(in.groups.expert, groups->mutable_expert());
  groupsToProto(in.groups.expertData, groups->mutable_expert_data());
  if (in.routing) {
    const auto& r = *in.routing;
    auto* routing = out.mutable_routing();
    routing->set_preset(r.preset);
    routing->set_score_func(r.scoring == RouterConfig::Scoring::kSigmoid ? "sigmoid" : "softmax");
    routing->set_top_k(r.topK);
    routing->set_route_norm(r.normalizeTopK);
    routing->set_route_scale(r.routeScale);
    routing->set_routed_scaling_factor(r.routedScalingFactor);
    routing->set_num_expert_groups(r.groups);
    routing->set_num_limited_groups(r.groupsPerToken);
    routing->set_has_shared_experts(r.sharedExperts);
    routing->set_use_grouped_mm(r.groupedMm);
    routing->set_expert_activation(planner::expertActivationName(r.expertMlp.activation));
    routing->set_activation_alpha(r.expertMlp.alpha);
    routing->set_activation_limit(r.expertMlp.limit);
    routing->set_fused_gate_up(r.expertMlp.fusedGateUp);
  }
  out.mutable_parameters()->Reserve(static_cast<int>(in.parameters.size()));
  for (const auto& p : in.parameters) parameterToProto(p, out.add_parameters());
  auto* zero = out.mutable_zero();
  zero->set_stage(in.zero.stage);
  zero->set_dense_group_size(in.zero.denseGroupSize);
  zero->set_expert_group_size(in.zero.expertGroupSize);
  zero->set_persistence_threshold(in.zero.persistenceThreshold);
  zero->set_model_persistence_threshold(in.zero.modelPersistenceThreshold);
  zero->set_offload_optimizer(in.zero.offloadOptimizer);
  for (const auto& b : in.zero.buffers) bufferToProto(b, zero->add_buffers());
  auto* memory = out.mutable_memory();
  memory->set_parameters(in.memory.parameters);
  memory->set_gradients(in.memory.gradients);
  memory->set_optimizer(in.memory.optimizer);
  memory->set_activations(in.memory.activations);
  memory->set_host_optimizer(in.memory.hostOptimizer);
  memory->set_host_parameters(in.memory.hostParameters);
  memory->set_total(in.memory.total());
  out.set_device_memory_bytes(in.deviceMemoryBytes);
  return out;
}

planner::Plan fromProto(const v1::Plan& in) {
  planner::Plan out;
  out.jobName = in.job_name();
  out.modelFamily = in.model_family();
  out.training = in.training();
  out.precision = precisionFromName(in.precision());
  out.microBatch = in.micro_batch();
  out.sequenceLength = in.sequence_length();
  const auto& m = in.mesh();
  out.mesh = planner::PlanMesh{.world = m.world(), .dp = m.dp(), .sp = m.sp(), .tp = m.tp(), .ep = m.ep()};
  const auto& g = in.groups();
  out.groups = planner::PlanGroups{.tensor = groupsFromProto(g.tensor()),
                                   .sequence = groupsFromProto(g.sequence()),
                                   .data = groupsFromProto(g.data()),
                                   .denseData = groupsFromProto(g.dense_data()),
                                   .expert = groupsFromProto(g.expert()),
                                   .expertData = groupsFromProto(g.expert_data())};
  if (in.has_routing()) {
    const auto& r = in.routing();
    out.routing = planner::ExpertRouting{
        .preset = r.preset(),
        .scoring = r.score_func() == "sigmoid" ? RouterConfig::Scoring::kSigmoid : RouterConfig::Scoring::kSoftmax,
        .topK = r.top_k(),
        .normalizeTopK = r.route_norm(),
        .routeScale = r.route_scale(),
        .routedScalingFactor = r.routed_scaling_factor(),
        .groups = r.num_expert_groups(),
        .groupsPerToken = r.num_limited_groups(),
        .sharedExperts = r.has_shared_experts(),
        .groupedMm = r.use_grouped_mm(),
        .expertMlp = {.activation = ExpertMlpConfig::Activation::kSwiglu,
                      .alpha = r.activation_alpha(),
                      .limit = r.activation_limit(),
                      .fusedGateUp = r.fused_gate_up()}};
    planner::parseExpertActivation(r.expert_activation(), &out.routing->expertMlp.activation);
  }
  out.parameters.reserve(in.parameters_size());
  for (const auto& p : in.parameters()) out.parameters.push_back(parameterFromProto(p));
  const auto& z = in.zero();
  out.zero = planner::ZeroPlan{.stage = z.stage(),
                               .denseGroupSize = z.dense_group_size(),
                               .expertGroupSize = z.expert_group_size(),
                               .persistenceThreshold = z.persistence_threshold(),
                               .modelPersistenceThreshold = z.model_persistence_threshold(),
                               .offloadOptimizer = z.offload_optimizer(),
                               .buffers = {}};
  for (const auto& b : z.buffers()) out.zero.buffers.push_back(bufferFromProto(b));
  const auto& mem = in.memory();
  out.memory = planner::MemoryEstimate{.parameters = mem.parameters(), .gradients = mem.gradients(),
                                       .optimizer = mem.optimizer(), .activations = mem.activations(),
                                       .hostOptimizer = mem.host_optimizer(),
                                       .hostParameters = mem.host_parameters()};
  out.deviceMemoryBytes = in.device_memory_bytes();
  return out;
}

bool mergeGenerateResponses(v1::GenerateResponse& into, v1::GenerateResponse& next) {
  if (into.weights_version() != next.weights_version()) return false;
  if (next.prompt_tokens()) into.set_prompt_tokens(next.prompt_tokens());
  if (!next.prompt_token_ids().empty()) *into.mutable_prompt_token_ids() = std::move(*next.mutable_prompt_token_ids());
  for (auto& delta : *next.mutable_samples()) {
    v1::SampleDelta* same = nullptr;
    for (auto& d : *into.mutable_samples())
      if (d.sample() == delta.sample() && d.finish_reason().empty()) same = &d;
    if (!same) {
      *into.add_samples() = std::move(delta);
      continue;
    }
    same->mutable_token_ids()->MergeFrom(delta.token_ids());
    same->mutable_logprobs()->MergeFrom(delta.logprobs());
    for (auto& t : *delta.mutable_top_logprobs()) *same->add_top_logprobs() = std::move(t);
    same->mutable_text()->append(delta.text());
    same->set_finish_reason(delta.finish_reason());
  }
  return true;
}

}  // namespace loom::convert
