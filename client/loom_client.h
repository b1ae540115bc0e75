#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/security/credentials.h"
#include "common/status.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"
#include "loom/v1/rollout.grpc.pb.h"
#include "proto/convert.h"

namespace loom::client {

// A small synchronous client of the public API, for loomctl, tests and schedulers written in
// C++. Every call is one RPC; errors come back as Status with the server's code and message.
// Thread-safe (gRPC stubs are).
class LoomClient {
 public:
  // "host:port"; the channel connects lazily. It accepts messages of any size (a Plan has an
  // entry per tensor of the model, more than gRPC's default 4 MiB for the largest models).
  LoomClient(const std::string& address, const security::ClientCredentials& credentials);
  explicit LoomClient(std::shared_ptr<grpc::Channel> channel);

  // Waits until the server answers (health check), for at most `timeout`.
  Status awaitReady(std::chrono::milliseconds timeout);

  StatusOr<v1::CreateJobResponse> createJob(const std::string& specJson, const std::string& requestId = "");
  StatusOr<v1::Job> getJob(const std::string& jobId);
  // A train or eval job's Plan (NOT_FOUND for a probe job).
  StatusOr<v1::Plan> getJobPlan(const std::string& jobId);
  StatusOr<v1::ListJobsResponse> listJobs(const v1::ListJobsRequest& request);
  // Every stored metric of the job that matches the request's names and ranks, oldest first
  // (all pages, from the request's page token on).
  StatusOr<std::vector<v1::Metric>> listJobMetrics(v1::ListJobMetricsRequest request);
  StatusOr<v1::Job> cancelJob(const std::string& jobId, const std::string& reason = "");
  StatusOr<std::string> validateJob(const std::string& specJson);
  StatusOr<std::vector<v1::Node>> listNodes();
  StatusOr<v1::Node> drainNode(const std::string& nodeId, const std::string& reason);
  StatusOr<v1::Node> uncordonNode(const std::string& nodeId);

  // Streams the job's updates to `onUpdate` until the job ends (returns OK), `onUpdate` returns
  // false (returns Cancelled) or the stream fails.
  Status watchJob(const std::string& jobId, const std::function<bool(const v1::JobUpdate&)>& onUpdate,
                  std::chrono::milliseconds timeout = std::chrono::milliseconds::zero());
  // Streams log chunks to `onChunk` until done (with follow: until the ranks end).
  Status streamLogs(const v1::GetJobLogsRequest& request, const std::function<bool(const v1::LogChunk&)>& onChunk);
  // Waits for a final state; DeadlineExceeded after `timeout` (zero: no limit).
  StatusOr<v1::Job> awaitJob(const std::string& jobId, std::chrono::milliseconds timeout);

  // RolloutService, through the planner to a served rollout's rank 0. Generate streams each
  // response to `onResponse` until the request is done (OK), `onResponse` returns false (the
  // request is cancelled; returns Cancelled) or the call fails.
  Status generate(const v1::GenerateRequest& request,
                  const std::function<bool(const v1::GenerateResponse&)>& onResponse);
  StatusOr<v1::GenerateBatchResponse> generateBatch(const v1::GenerateBatchRequest& request);
  StatusOr<v1::RolloutStatus> updateWeights(const v1::UpdateWeightsRequest& request);
  StatusOr<v1::RolloutStatus> pauseRollout(const std::string& jobId);
  StatusOr<v1::RolloutStatus> resumeRollout(const std::string& jobId);
  StatusOr<v1::RolloutStatus> rolloutStatus(const std::string& jobId);

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::NodeService::Stub> nodes_;
  std::unique_ptr<v1::RolloutService::Stub> rollouts_;
};

using convert::fromGrpc;
bool isFinalState(v1::JobState state);
// "RUNNING", "SUCCEEDED", ... (the enum's name)
std::string stateName(v1::JobState state);

}  // namespace loom::client
