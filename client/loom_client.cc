#include "client/loom_client.h"

#include <thread>

#include <grpcpp/health_check_service_interface.h>

namespace loom::client {

bool isFinalState(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

std::string stateName(v1::JobState state) { return v1::JobState_Name(state); }

namespace {

// Hands each message of a server stream to `onMessage` until the stream ends (its status) or
// `onMessage` returns false (the call is cancelled; `whenStopped`).
template <typename Message>
Status readStream(grpc::ClientContext& ctx, grpc::ClientReader<Message>& reader,
                  const std::function<bool(const Message&)>& onMessage, Status whenStopped) {
  Message message;
  while (reader.Read(&message)) {
    if (!onMessage(message)) {
      ctx.TryCancel();
      reader.Finish();
      return whenStopped;
    }
  }
  return fromGrpc(reader.Finish());
}

// One RolloutService call that takes only the job's id.
template <typename Method>
StatusOr<v1::RolloutStatus> rolloutCall(v1::RolloutService::Stub* stub, Method method, const std::string& jobId) {
  grpc::ClientContext ctx;
  v1::RolloutJobRequest request;
  request.set_job_id(jobId);
  v1::RolloutStatus status;
  RETURN_IF_ERROR(fromGrpc((stub->*method)(&ctx, request, &status)));
  return status;
}

std::shared_ptr<grpc::Channel> channelTo(const std::string& address, const security::ClientCredentials& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  return security::makeChannel(address, credentials, args);
}

}  // namespace

LoomClient::LoomClient(const std::string& address, const security::ClientCredentials& credentials)
    : LoomClient(channelTo(address, credentials)) {}

LoomClient::LoomClient(std::shared_ptr<grpc::Channel> channel)
    : channel_(std::move(channel)),
      jobs_(v1::JobService::NewStub(channel_)),
      nodes_(v1::NodeService::NewStub(channel_)),
      rollouts_(v1::RolloutService::NewStub(channel_)) {}

Status LoomClient::awaitReady(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::system_clock::now() + timeout;
  if (!channel_->WaitForConnected(deadline))
    return unavailable("no Loom server answered within {} ms", timeout.count());
  return Status::ok();
}

StatusOr<v1::CreateJobResponse> LoomClient::createJob(const std::string& specJson, const std::string& requestId) {
  grpc::ClientContext ctx;
  v1::CreateJobRequest request;
  request.set_spec_json(specJson);
  request.set_request_id(requestId);
  v1::CreateJobResponse response;
  RETURN_IF_ERROR(fromGrpc(jobs_->CreateJob(&ctx, request, &response)));
  return response;
}

StatusOr<v1::Job> LoomClient::getJob(const std::string& jobId) {
  grpc::ClientContext ctx;
  v1::GetJobRequest request;
  request.set_job_id(jobId);
  v1::Job job;
  RETURN_IF_ERROR(fromGrpc(jobs_->GetJob(&ctx, request, &job)));
  return job;
}

StatusOr<v1::Plan> LoomClient::getJobPlan(const std::string& jobId) {
  grpc::ClientContext ctx;
  v1::GetJobPlanRequest request;
  request.set_job_id(jobId);
  v1::Plan plan;
  RETURN_IF_ERROR(fromGrpc(jobs_->GetJobPlan(&ctx, request, &plan)));
  return plan;
}

StatusOr<std::vector<v1::Metric>> LoomClient::listJobMetrics(v1::ListJobMetricsRequest request) {
  std::vector<v1::Metric> all;
  bool more = true;
  while (more) {
    grpc::ClientContext ctx;
    v1::ListJobMetricsResponse page;
    RETURN_IF_ERROR(fromGrpc(jobs_->ListJobMetrics(&ctx, request, &page)));
    all.insert(all.end(), page.metrics().begin(), page.metrics().end());
    request.set_page_token(page.next_page_token());
    more = page.more();
  }
  return all;
}

StatusOr<v1::ListJobsResponse> LoomClient::listJobs(const v1::ListJobsRequest& request) {
  grpc::ClientContext ctx;
  v1::ListJobsResponse response;
  RETURN_IF_ERROR(fromGrpc(jobs_->ListJobs(&ctx, request, &response)));
  return response;
}

StatusOr<v1::Job> LoomClient::cancelJob(const std::string& jobId, const std::string& reason) {
  grpc::ClientContext ctx;
  v1::CancelJobRequest request;
  request.set_job_id(jobId);
  request.set_reason(reason);
  v1::Job job;
  RETURN_IF_ERROR(fromGrpc(jobs_->CancelJob(&ctx, request, &job)));
  return job;
}

StatusOr<std::string> LoomClient::validateJob(const std::string& specJson) {
  grpc::ClientContext ctx;
  v1::ValidateJobRequest request;
  request.set_spec_json(specJson);
  v1::ValidateJobResponse response;
  RETURN_IF_ERROR(fromGrpc(jobs_->ValidateJob(&ctx, request, &response)));
  return response.normalized_spec_json();
}

StatusOr<std::vector<v1::Node>> LoomClient::listNodes() {
  grpc::ClientContext ctx;
  v1::ListNodesResponse response;
  RETURN_IF_ERROR(fromGrpc(nodes_->ListNodes(&ctx, v1::ListNodesRequest(), &response)));
  return std::vector<v1::Node>(response.nodes().begin(), response.nodes().end());
}

StatusOr<v1::Node> LoomClient::drainNode(const std::string& nodeId, const std::string& reason) {
  grpc::ClientContext ctx;
  v1::DrainNodeRequest request;
  request.set_node_id(nodeId);
  request.set_reason(reason);
  v1::Node node;
  RETURN_IF_ERROR(fromGrpc(nodes_->DrainNode(&ctx, request, &node)));
  return node;
}

StatusOr<v1::Node> LoomClient::uncordonNode(const std::string& nodeId) {
  grpc::ClientContext ctx;
  v1::UncordonNodeRequest request;
  request.set_node_id(nodeId);
  v1::Node node;
  RETURN_IF_ERROR(fromGrpc(nodes_->UncordonNode(&ctx, request, &node)));
  return node;
}

Status LoomClient::watchJob(const std::string& jobId, const std::function<bool(const v1::JobUpdate&)>& onUpdate,
                            std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  if (timeout.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::WatchJobRequest request;
  request.set_job_id(jobId);
  return readStream(ctx, *jobs_->WatchJob(&ctx, request), onUpdate, {StatusCode::kCancelled, "stopped watching"});
}

Status LoomClient::streamLogs(const v1::GetJobLogsRequest& request,
                              const std::function<bool(const v1::LogChunk&)>& onChunk) {
  grpc::ClientContext ctx;
  return readStream(ctx, *jobs_->GetJobLogs(&ctx, request), onChunk, Status::ok());
}

StatusOr<v1::Job> LoomClient::awaitJob(const std::string& jobId, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const bool bounded = timeout.count() > 0;
  const auto deadline = Clock::now() + timeout;
  v1::Job last;
  // A planner that restarts drops the stream: watch again until the job ends or time runs out.
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (bounded && left.count() <= 0) left = std::chrono::milliseconds(1);
    Status s = watchJob(
        jobId,
        [&](const v1::JobUpdate& update) {
          last = update.job();
          return true;
        },
        bounded ? left : std::chrono::milliseconds::zero());
    if (s.isOk() && isFinalState(last.state())) return last;
    const bool expired = bounded && Clock::now() >= deadline;
    if (s.code() == StatusCode::kDeadlineExceeded || (expired && (s.isOk() || s.code() == StatusCode::kUnavailable)))
      return Status(StatusCode::kDeadlineExceeded,
                    "job " + jobId + " did not end within the timeout (now " + stateName(last.state()) + ")");
    if (!s.isOk() && s.code() != StatusCode::kUnavailable) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Status LoomClient::generate(const v1::GenerateRequest& request,
                            const std::function<bool(const v1::GenerateResponse&)>& onResponse) {
  grpc::ClientContext ctx;
  return readStream(ctx, *rollouts_->Generate(&ctx, request), onResponse,
                    {StatusCode::kCancelled, "stopped reading"});
}

StatusOr<v1::GenerateBatchResponse> LoomClient::generateBatch(const v1::GenerateBatchRequest& request) {
  grpc::ClientContext ctx;
  v1::GenerateBatchResponse response;
  RETURN_IF_ERROR(fromGrpc(rollouts_->GenerateBatch(&ctx, request, &response)));
  return response;
}

StatusOr<v1::RolloutStatus> LoomClient::updateWeights(const v1::UpdateWeightsRequest& request) {
  grpc::ClientContext ctx;
  v1::RolloutStatus status;
  RETURN_IF_ERROR(fromGrpc(rollouts_->UpdateWeights(&ctx, request, &status)));
  return status;
}

StatusOr<v1::RolloutStatus> LoomClient::pauseRollout(const std::string& jobId) {
  return rolloutCall(rollouts_.get(), &v1::RolloutService::Stub::Pause, jobId);
}

StatusOr<v1::RolloutStatus> LoomClient::resumeRollout(const std::string& jobId) {
  return rolloutCall(rollouts_.get(), &v1::RolloutService::Stub::Resume, jobId);
}

StatusOr<v1::RolloutStatus> LoomClient::rolloutStatus(const std::string& jobId) {
  return rolloutCall(rollouts_.get(), &v1::RolloutService::Stub::GetRolloutStatus, jobId);
}

}  // namespace loom::client
