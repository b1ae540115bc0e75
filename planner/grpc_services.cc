#include "planner/grpc_services.h"

#include <cstdlib>

#include <spdlog/spdlog.h>

#include "planner/job_plan.h"
#include "planner/plan_compiler.h"
#include "planner/write_queue.h"
#include "proto/convert.h"

namespace loom::planner {

v1::JobState toProto(JobState state) { return static_cast<v1::JobState>(static_cast<int>(state) + 1); }
JobState fromProto(v1::JobState state) { return static_cast<JobState>(static_cast<int>(state) - 1); }

static v1::RankState toProto(RankState state) { return static_cast<v1::RankState>(static_cast<int>(state) + 1); }

void toProto(const JobRecord& job, v1::Job* out) {
  out->set_id(job.id);
  out->set_name(job.spec.name);
  out->set_kind(jobKindName(job.spec.kind));
  out->set_state(toProto(job.state));
  out->set_reason(job.reason);
  out->set_attempt(job.attempt);
  out->set_restarts(job.restarts);
  out->set_max_restarts(job.spec.maxRestarts);
  out->set_preemptions(job.preemptions);
  out->set_tenant(job.tenant);
  out->set_owner(job.owner);
  out->set_world_size(job.spec.ranks);
  out->set_spec_json(job.specJson);
  out->set_create_time_ms(job.createTimeMs);
  out->set_update_time_ms(job.updateTimeMs);
  for (const auto& r : job.ranks) {
    auto* rank = out->add_ranks();
    rank->set_rank(r.rank);
    rank->set_node_id(r.nodeId);
    rank->set_pid(r.pid);
    rank->set_state(toProto(r.state));
    rank->set_exit_code(r.exitCode);
    rank->set_signal(r.signal);
    rank->set_detail(r.detail);
    rank->set_step(r.step);
    rank->set_service_address(r.serviceAddress);
    for (const auto& [k, v] : r.metrics) (*rank->mutable_metrics())[k] = v;
  }
  for (const auto& [k, v] : job.metrics) (*out->mutable_metrics())[k] = v;
}

void toProto(const JobRecord& job, v1::JobView view, v1::Job* out) {
  toProto(job, out);
  if (view == v1::JOB_VIEW_FULL) return;
  out->clear_spec_json();
  for (auto& rank : *out->mutable_ranks()) rank.clear_metrics();
}

namespace {

// A request's spec text, resolved against its base_dir when it names one; a user's paths are
// confined to its tenant's directories before any file the spec names (its ds_config) is read.
StatusOr<std::string> specText(const std::string& specJson, const std::string& baseDir, const Identity& caller,
                               const CallGate& gate) {
  if (baseDir.empty()) {
    RETURN_IF_ERROR(gate.confineSpec(caller, specJson));
    return specJson;
  }
  if (baseDir[0] != '/') return invalidArgument("base_dir: \"{}\" is not an absolute path", baseDir);
  const std::string resolved = resolveSpecPaths(specJson, baseDir);
  RETURN_IF_ERROR(gate.confineSpec(caller, resolved));
  ASSIGN_OR_RETURN(std::string whole, inlineDeepSpeedFile(resolved));
  RETURN_IF_ERROR(gate.confineSpec(caller, whole));  // the config file's monitors write too
  return whole;
}

}  // namespace

StatusOr<MetricQuery> metricQueryOf(const v1::ListJobMetricsRequest& request) {
  MetricQuery query{.jobId = request.job_id(),
                    .names = {request.names().begin(), request.names().end()},
                    .ranks = {request.ranks().begin(), request.ranks().end()}};
  if (request.page_size() < 0 || request.page_size() > kMaxMetricPage)
    return invalidArgument("page_size: must be 0 to {}", kMaxMetricPage);
  if (request.page_size() > 0) query.limit = request.page_size();
  if (!request.page_token().empty()) {
    char* end = nullptr;
    query.afterRow = std::strtoll(request.page_token().c_str(), &end, 10);
    if (*end != '\0' || query.afterRow < 0) return invalidArgument("page_token: not a token this server issued");
  }
  return query;
}

void toProto(const JobEvent& e, v1::JobEvent* out) {
  out->set_seq(e.seq);
  out->set_time_ms(e.timeMs);
  out->set_state(toProto(e.state));
  out->set_attempt(e.attempt);
  out->set_reason(e.reason);
}

void toProto(const Metric& m, v1::Metric* out) {
  out->set_attempt(m.attempt);
  out->set_rank(m.rank);
  out->set_step(m.step);
  out->set_name(m.name);
  out->set_value(m.value);
  out->set_time_ms(m.timeMs);
}

void toProto(const JobUpdate& update, v1::JobUpdate* out) {
  toProto(update.job, out->mutable_job());
  for (const auto& e : update.events) toProto(e, out->add_events());
  for (const auto& m : update.metrics) toProto(m, out->add_metrics());
}

void toProto(const NodeView& n, v1::Node* node) {
  node->set_node_id(n.nodeId);
  node->set_hostname(n.hostname);
  node->set_address(n.address);
  node->set_slots(n.slots);
  node->set_used_slots(n.usedSlots);
  node->set_gpus(n.gpus);
  node->set_used_gpus(n.usedGpus);
  node->set_connected(n.connected);
  node->set_last_seen_ms(n.lastSeenMs);
  node->set_cordoned(n.cordoned);
  node->set_cordon_reason(n.cordonReason);
}

// ---- unary calls ------------------------------------------------------------------------------

namespace {

// The reactor finished with `status`, for a refusal before the call does anything.
grpc::ServerUnaryReactor* refuse(grpc::ServerUnaryReactor* reactor, const Status& status) {
  reactor->Finish(toGrpc(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::CreateJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CreateJobRequest* request,
                                                    v1::CreateJobResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = gate_->caller(*ctx, {Role::kAdmin, Role::kUser}, "submit jobs");
  if (!caller.isOk()) return refuse(reactor, caller.status());
  auto text = specText(request->spec_json(), request->base_dir(), *caller, *gate_);
  if (!text.isOk()) return refuse(reactor, text.status());
  core_->createJob(std::move(text).value(), request->request_id(), JobOwner{caller->tenant, caller->user},
                   [reactor, response](const StatusOr<JobRecord>& job, bool created) {
                     if (job.isOk()) {
                       toProto(*job, response->mutable_job());
                       response->set_created(created);
                     }
                     reactor->Finish(toGrpc(job.status()));
                   });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* request,
                                                 v1::Job* response) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = gate_->caller(*ctx, {Role::kAdmin, Role::kUser}, "read jobs");
  if (!caller.isOk()) return refuse(reactor, caller.status());
  auto job = core_->job(request->job_id());
  if (!job.isOk()) return refuse(reactor, job.status());
  if (Status allowed = mayActOnJob(*caller, (*job)->id, (*job)->tenant, "read"); !allowed.isOk())
    return refuse(reactor, allowed);
  toProto(**job, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJobPlan(grpc::CallbackServerContext* ctx,
                                                     const v1::GetJobPlanRequest* request, v1::Plan* response) {
  auto* reactor = ctx->DefaultReactor();
  gate_->checkJob(*ctx, request->job_id(), "read the plan of",
                  [this, reactor, response, jobId = request->job_id()](const Status& allowed) {
                    if (!allowed.isOk()) return reactor->Finish(toGrpc(allowed));
                    core_->getJobPlan(jobId, [reactor, response](const StatusOr<Plan>& plan) {
                      if (plan.isOk()) *response = convert::toProto(*plan);
                      reactor->Finish(toGrpc(plan.status()));
                    });
                  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = gate_->caller(*ctx, {Role::kAdmin, Role::kUser}, "list jobs");
  if (!caller.isOk()) return refuse(reactor, caller.status());
  if (!v1::JobView_IsValid(request->view()))
    return refuse(reactor, invalidArgument("view: {} is not a job view", static_cast<int>(request->view())));
  ListQuery query{.pageSize = request->page_size(), .pageToken = request->page_token(), .states = {}};
  if (caller->role == Role::kUser) query.tenant = caller->tenant;
  for (int s : request->states()) {
    if (!v1::JobState_IsValid(s) || s == v1::JOB_STATE_UNSPECIFIED)
      return refuse(reactor, invalidArgument("states: {} is not a job state", s));
    query.states.insert(fromProto(static_cast<v1::JobState>(s)));
  }
  auto page = core_->listJobs(query);
  if (page.isOk()) {
    for (const auto& job : page->jobs) toProto(*job, request->view(), response->add_jobs());
    response->set_next_page_token(page->nextPageToken);
  }
  reactor->Finish(toGrpc(page.status()));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobMetrics(grpc::CallbackServerContext* ctx,
                                                         const v1::ListJobMetricsRequest* request,
                                                         v1::ListJobMetricsResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  auto query = metricQueryOf(*request);
  if (!query.isOk()) return refuse(reactor, query.status());
  gate_->checkJob(*ctx, request->job_id(), "read the metrics of",
                  [this, reactor, response, query = std::move(query).value()](const Status& allowed) mutable {
                    if (!allowed.isOk()) return reactor->Finish(toGrpc(allowed));
                    core_->listJobMetrics(std::move(query), [reactor, response](const StatusOr<MetricPage>& page) {
                      if (page.isOk()) {
                        for (const auto& m : page->metrics) toProto(m, response->add_metrics());
                        response->set_next_page_token(std::to_string(page->lastRow));
                        response->set_more(page->more);
                      }
                      reactor->Finish(toGrpc(page.status()));
                    });
                  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CancelJobRequest* request, v1::Job* response) {
  auto* reactor = ctx->DefaultReactor();
  gate_->checkJob(*ctx, request->job_id(), "cancel",
                  [this, reactor, response, jobId = request->job_id(), reason = request->reason()](const Status& allowed) {
                    if (!allowed.isOk()) return reactor->Finish(toGrpc(allowed));
                    core_->cancelJob(jobId, reason, [reactor, response](const StatusOr<JobRecord>& job) {
                      if (job.isOk()) toProto(*job, response);
                      reactor->Finish(toGrpc(job.status()));
                    });
                  });
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ValidateJob(grpc::CallbackServerContext* ctx,
                                                      const v1::ValidateJobRequest* request,
                                                      v1::ValidateJobResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = gate_->caller(*ctx, {Role::kAdmin, Role::kUser}, "validate jobs");
  if (!caller.isOk()) return refuse(reactor, caller.status());
  auto text = specText(request->spec_json(), request->base_dir(), *caller, *gate_);
  if (!text.isOk()) return refuse(reactor, text.status());
  // What CreateJob would refuse: the spec, and a train or eval job's plan.
  auto spec = parseJobSpec(*text);
  Status status = spec.status();
  if (spec.isOk() && checkHasPlan(*spec).isOk()) status = compileJobPlan(*spec).status();
  if (status.isOk()) response->set_normalized_spec_json(spec->toJson().dump(2));
  reactor->Finish(toGrpc(status));
  return reactor;
}

// ---- WatchJob ---------------------------------------------------------------------------------

namespace {

class WatchReactor final : public grpc::ServerWriteReactor<v1::JobUpdate> {
 public:
  using Queue = WriteQueue<v1::JobUpdate, grpc::ServerWriteReactor<v1::JobUpdate>>;

  // The core holds the watcher (this object's JobWatcher face) through a shared_ptr that does
  // not own the reactor: the reactor deletes itself in OnDone, after which the queue refuses.
  struct Watcher final : JobWatcher {
    std::shared_ptr<Queue> queue;
    bool onUpdate(const JobUpdate& update) override {
      v1::JobUpdate out;
      toProto(update, &out);
      return queue->push(std::move(out));
    }
    void onEnd(const Status& status) override { queue->finish(toGrpc(status)); }
  };

  WatchReactor() : queue_(std::make_shared<Queue>(this)) {}
  std::shared_ptr<JobWatcher> watcher() {
    auto w = std::make_shared<Watcher>();
    w->queue = queue_;
    return w;
  }
  void OnWriteDone(bool ok) override { queue_->writeDone(ok); }
  void OnCancel() override { queue_->finish(grpc::Status::CANCELLED); }
  void OnDone() override {
    queue_->detach();
    delete this;
  }

 private:
  std::shared_ptr<Queue> queue_;
};

class LogReactor final : public grpc::ServerWriteReactor<v1::LogChunk> {
 public:
  using Queue = WriteQueue<v1::LogChunk, grpc::ServerWriteReactor<v1::LogChunk>>;
  struct Sink final : LogSink {
    std::shared_ptr<Queue> queue;
    bool onChunk(int rank, int attempt, const std::string& data) override {
      v1::LogChunk chunk;
      chunk.set_rank(rank);
      chunk.set_attempt(attempt);
      chunk.set_data(data);
      return queue->push(std::move(chunk));
    }
    void onEnd(const Status& status) override { queue->finish(toGrpc(status)); }
  };

  explicit LogReactor(PlannerCore* core) : core_(core), queue_(std::make_shared<Queue>(this)) {
    sink_ = std::make_shared<Sink>();
    sink_->queue = queue_;
  }
  std::shared_ptr<Sink> sink() { return sink_; }
  void OnWriteDone(bool ok) override { queue_->writeDone(ok); }
  void OnCancel() override {
    core_->stopLogs(sink_);
    queue_->finish(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    queue_->detach();
    delete this;
  }

 private:
  PlannerCore* core_;
  std::shared_ptr<Queue> queue_;
  std::shared_ptr<Sink> sink_;
};

}  // namespace

grpc::ServerWriteReactor<v1::JobUpdate>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                  const v1::WatchJobRequest* request) {
  auto* reactor = new WatchReactor();
  // The watcher outlives a reactor that a client's cancel deletes before the check answers.
  gate_->checkJob(*ctx, request->job_id(), "watch",
                  [this, watcher = reactor->watcher(), jobId = request->job_id()](const Status& allowed) {
                    if (!allowed.isOk()) return watcher->onEnd(allowed);
                    core_->watchJob(jobId, watcher);
                  });
  return reactor;
}

grpc::ServerWriteReactor<v1::LogChunk>* JobServiceImpl::GetJobLogs(grpc::CallbackServerContext* ctx,
                                                                   const v1::GetJobLogsRequest* request) {
  auto* reactor = new LogReactor(core_);
  LogQuery query{.requestId = 0, .jobId = request->job_id(), .attempt = request->attempt(), .ranks = {},
                 .tailLines = request->tail_lines(), .follow = request->follow()};
  for (int r : request->ranks()) query.ranks.push_back(r);
  gate_->checkJob(*ctx, request->job_id(), "read the logs of",
                  [this, sink = reactor->sink(), query = std::move(query)](const Status& allowed) mutable {
                    if (!allowed.isOk()) return sink->onEnd(allowed);
                    core_->streamLogs(std::move(query), sink);
                  });
  return reactor;
}

// ---- Attach -----------------------------------------------------------------------------------

namespace {

using AttachBase = grpc::ServerBidiReactor<v1::NodeMessage, v1::PlannerMessage>;
using AttachQueue = WriteQueue<v1::PlannerMessage, AttachBase>;

// The planner's end of one daemon's stream, as the core sees it.
class GrpcNodeLink final : public NodeLink {
 public:
  explicit GrpcNodeLink(std::shared_ptr<AttachQueue> queue) : queue_(std::move(queue)) {}
  void launch(const LaunchOrder& order) override {
    v1::PlannerMessage m;
    *m.mutable_launch() = convert::toProto(order);
    queue_->push(std::move(m));
  }
  void kill(const KillOrder& order) override {
    v1::PlannerMessage m;
    *m.mutable_kill() = convert::toProto(order);
    queue_->push(std::move(m));
  }
  void release(const ReleaseOrder& order) override {
    v1::PlannerMessage m;
    *m.mutable_release() = convert::toProto(order);
    queue_->push(std::move(m));
  }
  void requestLogs(const LogQuery& query) override {
    v1::PlannerMessage m;
    *m.mutable_log_request() = convert::toProto(query);
    queue_->push(std::move(m));
  }
  void cancelLogs(int64_t requestId) override {
    v1::PlannerMessage m;
    m.mutable_log_cancel()->set_request_id(requestId);
    queue_->push(std::move(m));
  }
  void registered(int64_t heartbeatIntervalMs) {
    v1::PlannerMessage m;
    m.mutable_registered()->set_heartbeat_interval_ms(heartbeatIntervalMs);
    queue_->push(std::move(m));
  }
  void close(const Status& why) override { queue_->finish(toGrpc(why)); }

 private:
  std::shared_ptr<AttachQueue> queue_;
};

// The host part of a gRPC peer string ("ipv4:10.0.0.5:41234", "ipv6:[fd00::1]:41234"), or
// 127.0.0.1 for an in-process peer.
std::string peerHost(const std::string& peer) {
  if (peer.rfind("ipv4:", 0) == 0) return peer.substr(5, peer.rfind(':') - 5);
  if (peer.rfind("ipv6:[", 0) == 0) return peer.substr(6, peer.find(']') - 6);
  return "127.0.0.1";
}

class AttachReactor final : public AttachBase {
 public:
  // `caller`: who opened the stream; a refusal ends it before anything is read.
  AttachReactor(PlannerCore* core, std::string peer, StatusOr<Identity> caller, bool insecure)
      : core_(core),
        peer_(std::move(peer)),
        caller_(std::move(caller)),
        insecure_(insecure),
        queue_(std::make_shared<AttachQueue>(this)),
        link_(std::make_shared<GrpcNodeLink>(queue_)) {
    if (!caller_.isOk()) {
      queue_->finish(toGrpc(caller_.status()));
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      queue_->finish(grpc::Status::OK);
      return;
    }
    dispatch();
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override { queue_->writeDone(ok); }
  void OnDone() override {
    if (registered_) core_->nodeDetached(link_);
    queue_->detach();
    delete this;
  }

 private:
  void dispatch() {
    switch (in_.msg_case()) {
      case v1::NodeMessage::kRegister:
        if (in_.register_().node_id().empty()) {
          queue_->finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "register.node_id: required"));
          return;
        }
      if (Status allowed = mayAttachAs(*caller_, in_.register_().node_id()); !allowed.isOk()) {
        queue_->finish(toGrpc(allowed));
        return;
      }
      {
        if (insecure_)
          spdlog::warn("node {} attached from {} over plain text (--insecure): its link and credentials can be read "
                       "and forged on the network",
                       in_.register_().node_id(), peer_);
        registered_ = true;
        link_->registered(core_->nodeHeartbeatIntervalMs());
        NodeRegistration registration = convert::fromProto(in_.register_());
        if (registration.address.empty()) registration.address = peerHost(peer_);
        core_->nodeRegistered(link_, std::move(registration));
        return;
      }
      case v1::NodeMessage::kHeartbeat:
        core_->nodeHeartbeat(link_);
        return;
      case v1::NodeMessage::kRankReport:
        core_->rankReported(link_, convert::fromProto(in_.rank_report()));
        return;
      case v1::NodeMessage::kMasterEndpoint:
        core_->masterEndpointReported(link_, convert::fromProto(in_.master_endpoint()));
        return;
      case v1::NodeMessage::kLogData:
        core_->logDataReceived(link_, convert::fromProto(in_.log_data()));
        return;
      case v1::NodeMessage::kDraining:
        core_->nodeDraining(link_);
        return;
      case v1::NodeMessage::MSG_NOT_SET:
        return;
    }
  }

  PlannerCore* core_;
  std::string peer_;
  StatusOr<Identity> caller_;
  bool insecure_;
  v1::NodeMessage in_;
  std::shared_ptr<AttachQueue> queue_;
  std::shared_ptr<GrpcNodeLink> link_;
  bool registered_ = false;
};

}  // namespace

grpc::ServerBidiReactor<v1::NodeMessage, v1::PlannerMessage>* NodeServiceImpl::Attach(grpc::CallbackServerContext* ctx) {
  return new AttachReactor(core_, ctx->peer(), gate_->caller(*ctx, {Role::kNode}, "attach a node"), insecure_);
}

grpc::ServerUnaryReactor* NodeServiceImpl::ListNodes(grpc::CallbackServerContext* ctx, const v1::ListNodesRequest*,
                                                     v1::ListNodesResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = gate_->caller(*ctx, {Role::kAdmin, Role::kUser}, "list nodes");
  if (!caller.isOk()) return refuse(reactor, caller.status());
  core_->listNodes([reactor, response](std::vector<NodeView> nodes) {
    for (const auto& n : nodes) toProto(n, response->add_nodes());
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* NodeServiceImpl::DrainNode(grpc::CallbackServerContext* ctx, const v1::DrainNodeRequest* request,
                                                     v1::Node* response) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = gate_->caller(*ctx, {Role::kAdmin}, "drain nodes");
  if (!caller.isOk()) return refuse(reactor, caller.status());
  if (request->node_id().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "node_id: required"));
    return reactor;
  }
  core_->drainNode(request->node_id(), request->reason(), [reactor, response](const StatusOr<NodeView>& node) {
    if (node.isOk()) toProto(*node, response);
    reactor->Finish(toGrpc(node.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* NodeServiceImpl::UncordonNode(grpc::CallbackServerContext* ctx,
                                                        const v1::UncordonNodeRequest* request, v1::Node* response) {
  auto* reactor = ctx->DefaultReactor();
  auto caller = gate_->caller(*ctx, {Role::kAdmin}, "uncordon nodes");
  if (!caller.isOk()) return refuse(reactor, caller.status());
  if (request->node_id().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "node_id: required"));
    return reactor;
  }
  core_->uncordonNode(request->node_id(), [reactor, response](const StatusOr<NodeView>& node) {
    if (node.isOk()) toProto(*node, response);
    reactor->Finish(toGrpc(node.status()));
  });
  return reactor;
}

}  // namespace loom::planner
