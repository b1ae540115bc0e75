#include "proto/convert.h"

namespace loom::convert {

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
  return out;
}

RankReport fromProto(const v1::RankReport& in) {
  RankReport out{.jobId = in.job_id(), .attempt = in.attempt(), .rank = in.rank(), .event = eventFromProto(in.event()),
                 .pid = in.pid(), .exitCode = in.exit_code(), .signal = in.signal(), .detail = in.detail(),
                 .step = in.step(), .metrics = {}, .timeMs = in.time_ms()};
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
  return out;
}

NodeRegistration fromProto(const v1::Register& in) {
  NodeRegistration out{.nodeId = in.node_id(), .hostname = in.hostname(), .address = in.address(), .slots = in.slots(),
                       .ranks = {}, .instanceId = in.instance_id()};
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
                  .gracePeriodMs = in.grace_period_ms(), .groupRank = in.group_rank()};
  for (const auto& r : in.ranks()) out.ranks.push_back({.rank = r.rank(), .localRank = r.local_rank()});
  return out;
}

v1::Kill toProto(const KillOrder& in) {
  v1::Kill out;
  out.set_job_id(in.jobId);
  out.set_attempt(in.attempt);
  out.set_grace_period_ms(in.gracePeriodMs);
  out.set_reason(in.reason);
  return out;
}

KillOrder fromProto(const v1::Kill& in) {
  return {.jobId = in.job_id(), .attempt = in.attempt(), .gracePeriodMs = in.grace_period_ms(), .reason = in.reason()};
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
