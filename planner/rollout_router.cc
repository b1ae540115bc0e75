#include "planner/rollout_router.h"

#include <atomic>

#include "common/security/credentials.h"
#include "planner/grpc_services.h"
#include "planner/write_queue.h"

namespace loom::planner {

StatusOr<std::string> rolloutServiceAddress(const JobRecord& job) {
  if (job.spec.kind != JobKind::kRollout)
    return failedPrecondition("job {} is a {} job: RolloutService serves rollout jobs with rollout.serve true", job.id,
                              jobKindName(job.spec.kind));
  if (!job.spec.rollout.serve)
    return failedPrecondition("job {} is a batch rollout (rollout.prompts): it takes no requests; submit one with "
                              "rollout.serve true",
                              job.id);
  if (isFinal(job.state))
    return failedPrecondition("job {} has ended {}: {}", job.id, jobStateName(job.state), job.reason);
  if (job.state != JobState::kRunning || job.ranks.empty() || job.ranks[0].serviceAddress.empty())
    return unavailable("job {} is {} and its rank 0 does not serve yet (the model is loading?): retry shortly",
                       job.id, jobStateName(job.state));
  return job.ranks[0].serviceAddress;
}

StatusOr<std::string> checkpointDirOfJob(const JobRecord& job) {
  if (job.spec.kind != JobKind::kTrain)
    return failedPrecondition("from_job_id: job {} is a {} job, not a train job", job.id, jobKindName(job.spec.kind));
  if (job.spec.train.checkpointDir.empty())
    return failedPrecondition("from_job_id: job {} keeps no checkpoints (its train.checkpoint_dir is empty)", job.id);
  return job.spec.train.checkpointDir;
}

namespace {

using Stub = v1::RolloutService::Stub;
using StubOr = StatusOr<std::shared_ptr<Stub>>;

// ---- Generate: a stream relayed as it comes ----------------------------------------------------

// The client's stream to the planner and the planner's to rank 0, joined. Held by gRPC's two
// calls and, until it answers, by the job lookup: the last to let go deletes it.
class GenerateRelay final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  using Queue = WriteQueue<v1::GenerateResponse, grpc::ServerWriteReactor<v1::GenerateResponse>>;

  GenerateRelay(RolloutRouter& router, grpc::CallbackServerContext* ctx, const v1::GenerateRequest& request)
      : queue_(std::make_shared<Queue>(this)), request_(request) {
    upstream_.relay = this;
    upstreamCtx_.set_deadline(ctx->deadline());
    router.route(router.caller(*ctx), request_.job_id(), [this](const StubOr& stub) {
      connect(stub);
      release();
    });
  }
  void OnWriteDone(bool ok) override {
    queue_->writeDone(ok);
    if (!ok) cancelUpstream();
  }
  void OnCancel() override {
    cancelUpstream();
    queue_->finish(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    queue_->detach();
    release();
  }

 private:
  struct Upstream final : grpc::ClientReadReactor<v1::GenerateResponse> {
    void OnReadDone(bool ok) override {
      if (!ok) return;  // OnDone follows with the call's status
      relay->queue_->push(std::move(message), convert::mergeGenerateResponses);
      message.Clear();
      StartRead(&message);
    }
    void OnDone(const grpc::Status& status) override {
      relay->queue_->finish(status);
      relay->release();
    }
    GenerateRelay* relay = nullptr;
    v1::GenerateResponse message;
  };

  void connect(const StubOr& stub) {
    {
      std::lock_guard lock(mu_);
      if (cancelled_) return;
      if (stub.isOk()) {
        ++refs_;
        stub_ = *stub;
      }
    }
    if (!stub.isOk()) return queue_->finish(toGrpc(stub.status()));
    stub_->async()->Generate(&upstreamCtx_, &request_, &upstream_);
    upstream_.StartRead(&upstream_.message);
    upstream_.StartCall();
  }
  // Before the relayed call starts, TryCancel cancels it as it starts.
  void cancelUpstream() {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
    }
    upstreamCtx_.TryCancel();
  }
  void release() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  std::shared_ptr<Queue> queue_;
  v1::GenerateRequest request_;
  grpc::ClientContext upstreamCtx_;
  Upstream upstream_;
  std::shared_ptr<Stub> stub_;
  std::mutex mu_;
  bool cancelled_ = false;
  std::atomic<int> refs_{2};  // the client's call until OnDone, and the lookup
};

// ---- unary calls: one reply relayed ------------------------------------------------------------

template <typename Request, typename Response>
class UnaryRelay final : public grpc::ServerUnaryReactor {
 public:
  using Forward = void (*)(Stub::async_interface* stub, grpc::ClientContext* ctx, const Request* request,
                           Response* response, std::function<void(grpc::Status)> done);

  UnaryRelay(RolloutRouter& router, grpc::CallbackServerContext* ctx, const Request& request, Response* response,
             Forward forward)
      : caller_(router.caller(*ctx)), request_(request), response_(response), forward_(forward) {
    upstreamCtx_.set_deadline(ctx->deadline());
  }
  Request& request() { return request_; }
  const StatusOr<Identity>& caller() const { return caller_; }

  // Looks the job up and relays the call to its rank 0.
  void start(RolloutRouter& router) {
    router.route(caller_, request_.job_id(), [this](const StubOr& stub) {
      connect(stub);
      release();
    });
  }
  // Answers without relaying (the lookup's own reference goes with it).
  void fail(const Status& status) {
    Finish(toGrpc(status));
    release();
  }
  void OnCancel() override {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
    }
    upstreamCtx_.TryCancel();
  }
  void OnDone() override { release(); }

 private:
  void connect(const StubOr& stub) {
    bool cancelled = false;
    {
      std::lock_guard lock(mu_);
      cancelled = cancelled_;
      if (!cancelled && stub.isOk()) {
        ++refs_;
        stub_ = *stub;
      }
    }
    if (cancelled) return Finish(grpc::Status::CANCELLED);
    if (!stub.isOk()) return Finish(toGrpc(stub.status()));
    forward_(stub_->async(), &upstreamCtx_, &request_, response_, [this](grpc::Status status) {
      Finish(status);
      release();
    });
  }
  void release() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  StatusOr<Identity> caller_;
  Request request_;
  Response* response_;
  Forward forward_;
  grpc::ClientContext upstreamCtx_;
  std::shared_ptr<Stub> stub_;
  std::mutex mu_;
  bool cancelled_ = false;
  std::atomic<int> refs_{2};  // the client's call until OnDone, and the lookup
};

template <typename Request, typename Response>
grpc::ServerUnaryReactor* relayUnary(RolloutRouter& router, grpc::CallbackServerContext* ctx, const Request& request,
                                     Response* response, typename UnaryRelay<Request, Response>::Forward forward) {
  auto* relay = new UnaryRelay<Request, Response>(router, ctx, request, response, forward);
  relay->start(router);
  return relay;
}

}  // namespace

StatusOr<Identity> RolloutRouter::caller(const grpc::ServerContextBase& ctx) {
  return gate_->caller(ctx, {Role::kAdmin, Role::kUser}, "use rollout jobs");
}

void RolloutRouter::route(const StatusOr<Identity>& caller, const std::string& jobId,
                          std::function<void(const StubOr&)> done) {
  if (!caller.isOk()) return done(caller.status());
  auto found = core_->job(jobId);
  if (!found.isOk()) return done(found.status());
  const JobRecord& job = **found;
  if (Status allowed = mayActOnJob(*caller, job.id, job.tenant, "use"); !allowed.isOk()) return done(allowed);
  auto address = rolloutServiceAddress(job);
  if (!address.isOk()) return done(address.status());
  done(stubFor(*address, core_->rankServices().client(job.id, job.attempt)));
}

std::shared_ptr<Stub> RolloutRouter::stubFor(const std::string& address, const security::ClientCredentials& credentials) {
  std::lock_guard lock(mu_);
  // An attempt's rank serves on a port of its own, with its own name and token: one channel each.
  auto& stub = stubs_[address + " " + credentials.serverName];
  if (!stub) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    stub = v1::RolloutService::NewStub(security::makeChannel(address, credentials, args));
  }
  return stub;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* RolloutRouter::Generate(grpc::CallbackServerContext* ctx,
                                                                        const v1::GenerateRequest* request) {
  return new GenerateRelay(*this, ctx, *request);
}

grpc::ServerUnaryReactor* RolloutRouter::GenerateBatch(grpc::CallbackServerContext* ctx,
                                                       const v1::GenerateBatchRequest* request,
                                                       v1::GenerateBatchResponse* response) {
  return relayUnary(*this, ctx, *request, response,
                    [](Stub::async_interface* stub, grpc::ClientContext* c, const v1::GenerateBatchRequest* q,
                       v1::GenerateBatchResponse* p, std::function<void(grpc::Status)> done) {
                      stub->GenerateBatch(c, q, p, std::move(done));
                    });
}

grpc::ServerUnaryReactor* RolloutRouter::UpdateWeights(grpc::CallbackServerContext* ctx,
                                                       const v1::UpdateWeightsRequest* request,
                                                       v1::RolloutStatus* response) {
  auto* relay = new UnaryRelay<v1::UpdateWeightsRequest, v1::RolloutStatus>(
      *this, ctx, *request, response,
      [](Stub::async_interface* stub, grpc::ClientContext* c, const v1::UpdateWeightsRequest* q, v1::RolloutStatus* p,
         std::function<void(grpc::Status)> done) { stub->UpdateWeights(c, q, p, std::move(done)); });
  if (!relay->caller().isOk()) {
    relay->fail(relay->caller().status());
    return relay;
  }
  const bool hasDir = !request->checkpoint_dir().empty(), hasJob = !request->from_job_id().empty();
  if (hasDir == hasJob) {
    relay->fail(invalidArgument("give checkpoint_dir or from_job_id, {}", hasDir ? "not both" : "one of them"));
    return relay;
  }
  if (hasDir) {
    if (Status allowed = gate_->confinePath(*relay->caller(), "checkpoint_dir", request->checkpoint_dir());
        !allowed.isOk()) {
      relay->fail(allowed);
      return relay;
    }
    relay->start(*this);
    return relay;
  }
  // A train job's latest checkpoint: its directory goes to rank 0, which reads `latest` there.
  auto train = core_->job(request->from_job_id());
  auto dir = train.isOk() ? checkpointDirOfJob(**train) : StatusOr<std::string>(train.status());
  if (train.isOk())
    if (Status allowed = mayActOnJob(*relay->caller(), (*train)->id, (*train)->tenant, "read the checkpoints of");
        !allowed.isOk())
      dir = allowed;
  if (!dir.isOk()) {
    relay->fail(dir.status().withContext("from_job_id"));
    return relay;
  }
  relay->request().set_checkpoint_dir(*dir);
  relay->request().clear_from_job_id();
  relay->start(*this);
  return relay;
}

grpc::ServerUnaryReactor* RolloutRouter::Pause(grpc::CallbackServerContext* ctx, const v1::RolloutJobRequest* request,
                                               v1::RolloutStatus* response) {
  return relayUnary(*this, ctx, *request, response,
                    [](Stub::async_interface* stub, grpc::ClientContext* c, const v1::RolloutJobRequest* q,
                       v1::RolloutStatus* p, std::function<void(grpc::Status)> done) {
                      stub->Pause(c, q, p, std::move(done));
                    });
}

grpc::ServerUnaryReactor* RolloutRouter::Resume(grpc::CallbackServerContext* ctx, const v1::RolloutJobRequest* request,
                                                v1::RolloutStatus* response) {
  return relayUnary(*this, ctx, *request, response,
                    [](Stub::async_interface* stub, grpc::ClientContext* c, const v1::RolloutJobRequest* q,
                       v1::RolloutStatus* p, std::function<void(grpc::Status)> done) {
                      stub->Resume(c, q, p, std::move(done));
                    });
}

grpc::ServerUnaryReactor* RolloutRouter::GetRolloutStatus(grpc::CallbackServerContext* ctx,
                                                          const v1::RolloutJobRequest* request,
                                                          v1::RolloutStatus* response) {
  return relayUnary(*this, ctx, *request, response,
                    [](Stub::async_interface* stub, grpc::ClientContext* c, const v1::RolloutJobRequest* q,
                       v1::RolloutStatus* p, std::function<void(grpc::Status)> done) {
                      stub->GetRolloutStatus(c, q, p, std::move(done));
                    });
}

}  // namespace loom::planner
