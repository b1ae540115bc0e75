#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "loom/v1/rollout.grpc.pb.h"
#include "planner/access_control.h"
#include "planner/planner_core.h"

namespace loom::planner {

// Where a RolloutService call for `job` goes: its rank 0's service address, or why there is none
// (FailedPrecondition: not a served rollout, or ended; Unavailable: not serving yet, retry).
StatusOr<std::string> rolloutServiceAddress(const JobRecord& job);

// The directory an UpdateWeights `from_job_id` names: the train job's train.checkpoint_dir (its
// `latest` is read by the rollout's rank 0 when it loads).
StatusOr<std::string> checkpointDirOfJob(const JobRecord& job);

// The public RolloutService: each call is looked up by its job id and relayed to the job's rank
// 0, whose answers (a stream of tokens, or one reply) come back as they are. A client that goes
// away cancels the relayed call too. No state but the channels to ranks.
class RolloutRouter final : public v1::RolloutService::CallbackService {
 public:
  RolloutRouter(PlannerCore* core, CallGate* gate) : core_(core), gate_(gate) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GenerateBatch(grpc::CallbackServerContext* ctx, const v1::GenerateBatchRequest* request,
                                          v1::GenerateBatchResponse* response) override;
  grpc::ServerUnaryReactor* UpdateWeights(grpc::CallbackServerContext* ctx, const v1::UpdateWeightsRequest* request,
                                          v1::RolloutStatus* response) override;
  grpc::ServerUnaryReactor* Pause(grpc::CallbackServerContext* ctx, const v1::RolloutJobRequest* request,
                                  v1::RolloutStatus* response) override;
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* ctx, const v1::RolloutJobRequest* request,
                                   v1::RolloutStatus* response) override;
  grpc::ServerUnaryReactor* GetRolloutStatus(grpc::CallbackServerContext* ctx, const v1::RolloutJobRequest* request,
                                             v1::RolloutStatus* response) override;

  // Who calls: a user or an admin (access_control.h).
  StatusOr<Identity> caller(const grpc::ServerContextBase& ctx);
  // The stub of rank 0 of `job` when `caller` may use it, or why there is none; answered on the
  // core's thread.
  void route(const StatusOr<Identity>& caller, const std::string& jobId,
             std::function<void(const StatusOr<std::shared_ptr<v1::RolloutService::Stub>>&)> done);

 private:
  std::shared_ptr<v1::RolloutService::Stub> stubFor(const std::string& address,
                                                    const security::ClientCredentials& credentials);

  PlannerCore* core_;
  CallGate* gate_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<v1::RolloutService::Stub>> stubs_;  // by address and attempt
};

}  // namespace loom::planner
