#pragma once

#include <memory>

#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"
#include "planner/access_control.h"
#include "planner/planner_core.h"
#include "proto/convert.h"

namespace loom::planner {

// The public JobService over the planner core: requests become core calls, domain records
// become wire messages. Every call passes the gate first (access_control.h). No state of its own.
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  JobServiceImpl(PlannerCore* core, CallGate* gate) : core_(core), gate_(gate) {}

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* ctx, const v1::CreateJobRequest* request,
                                      v1::CreateJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* request,
                                   v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJobPlan(grpc::CallbackServerContext* ctx, const v1::GetJobPlanRequest* request,
                                       v1::Plan* response) override;
  grpc::ServerUnaryReactor* ListJobMetrics(grpc::CallbackServerContext* ctx, const v1::ListJobMetricsRequest* request,
                                           v1::ListJobMetricsResponse* response) override;
  grpc::ServerUnaryReactor* ValidateJob(grpc::CallbackServerContext* ctx, const v1::ValidateJobRequest* request,
                                        v1::ValidateJobResponse* response) override;
  grpc::ServerWriteReactor<v1::JobUpdate>* WatchJob(grpc::CallbackServerContext* ctx,
                                                    const v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<v1::LogChunk>* GetJobLogs(grpc::CallbackServerContext* ctx,
                                                     const v1::GetJobLogsRequest* request) override;

 private:
  PlannerCore* core_;
  CallGate* gate_;
};

// The node daemons' Attach streams (node credentials only), ListNodes, and an admin's drain and
// uncordon.
class NodeServiceImpl final : public v1::NodeService::CallbackService {
 public:
  NodeServiceImpl(PlannerCore* core, CallGate* gate, bool insecure) : core_(core), gate_(gate), insecure_(insecure) {}

  grpc::ServerBidiReactor<v1::NodeMessage, v1::PlannerMessage>* Attach(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx, const v1::ListNodesRequest* request,
                                      v1::ListNodesResponse* response) override;
  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* ctx, const v1::DrainNodeRequest* request,
                                      v1::Node* response) override;
  grpc::ServerUnaryReactor* UncordonNode(grpc::CallbackServerContext* ctx, const v1::UncordonNodeRequest* request,
                                         v1::Node* response) override;

 private:
  PlannerCore* core_;
  CallGate* gate_;
  bool insecure_;  // plain text off loopback (--insecure): every attach logs a warning
};

using convert::toGrpc;
void toProto(const JobRecord& job, v1::Job* out);
// A list's row of the job: BASIC leaves out the spec and the ranks' metrics (ListJobsRequest.view).
void toProto(const JobRecord& job, v1::JobView view, v1::Job* out);
void toProto(const JobEvent& event, v1::JobEvent* out);
void toProto(const Metric& metric, v1::Metric* out);
void toProto(const JobUpdate& update, v1::JobUpdate* out);
void toProto(const NodeView& node, v1::Node* out);

// ListJobMetrics' request checked (page size, the token): INVALID_ARGUMENT naming the field.
inline constexpr int kMaxMetricPage = 100'000;
StatusOr<MetricQuery> metricQueryOf(const v1::ListJobMetricsRequest& request);
v1::JobState toProto(JobState state);
JobState fromProto(v1::JobState state);

}  // namespace loom::planner
