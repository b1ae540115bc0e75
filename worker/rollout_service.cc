#include "worker/rollout_service.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "common/security/credentials.h"
#include "common/security/tokens.h"
#include "loom/v1/rollout.grpc.pb.h"
#include "planner/write_queue.h"
#include "proto/convert.h"

namespace loom::worker {

namespace {

using rollout::DrawnToken;
using rollout::FinishReason;
using rollout::RolloutInbox;
using rollout::RolloutStatusView;

void toProto(const RolloutStatusView& s, v1::RolloutStatus* out) {
  out->set_weights_version(s.weightsVersion);
  out->set_weights_source(s.weightsSource);
  out->set_paused(s.paused);
  out->set_requests_running(s.requestsRunning);
  out->set_requests_waiting(s.requestsWaiting);
  out->set_kv_blocks_used(s.kvBlocksUsed);
  out->set_kv_blocks_total(s.kvBlocksTotal);
  out->set_preemptions(s.preemptions);
  out->set_requests_served(s.requestsServed);
  out->set_output_tokens(s.outputTokens);
  out->set_updates_pending(s.updatesPending);
}

void addToken(const DrawnToken& t, google::protobuf::RepeatedField<int64_t>* ids,
              google::protobuf::RepeatedField<float>* logprobs,
              google::protobuf::RepeatedPtrField<v1::TopLogprobs>* top) {
  ids->Add(t.token);
  logprobs->Add(t.logprob);
  if (t.top.empty()) return;
  auto* entries = top->Add();
  for (const auto& [id, logprob] : t.top) {
    auto* e = entries->add_entries();
    e->set_token_id(id);
    e->set_logprob(logprob);
  }
}

// A request's prompt and sampling as the engine loop takes them. `where` names the request in
// errors ("" for a single one, "prompts[3]: " in a batch).
StatusOr<rollout::ServedPrompt> readRequest(const v1::GenerateRequest& r, const planner::SamplingParams& defaults,
                                            const std::string& where) {
  rollout::ServedPrompt p;
  const bool hasText = !r.prompt().empty(), hasIds = r.prompt_token_ids_size() > 0;
  if (hasText == hasIds)
    return invalidArgument("{}give prompt (text) or prompt_token_ids, {}", where, hasText ? "not both" : "one of them");
  p.isText = hasText;
  p.text = r.prompt();
  p.tokenIds.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  p.sampling = defaults;
  if (!r.sampling_json().empty()) {
    const nlohmann::json sampling = nlohmann::json::parse(r.sampling_json(), nullptr, /*allow_exceptions=*/false);
    if (sampling.is_discarded()) return invalidArgument("{}sampling_json: not JSON: {}", where, r.sampling_json());
    ASSIGN_OR_RETURN(p.sampling, planner::parseSamplingParams(sampling, where + "sampling_json", defaults));
  }
  return p;
}

// ---- Generate: one request's tokens, streamed ---------------------------------------------------

using GenerateWriter = grpc::ServerWriteReactor<v1::GenerateResponse>;
using GenerateQueue = planner::WriteQueue<v1::GenerateResponse, GenerateWriter>;

// The engine's events for one request become responses on its stream. The sink lives as long
// as the engine holds it; the reactor until gRPC is done with it.
class StreamSink final : public rollout::RequestSink {
 public:
  explicit StreamSink(std::shared_ptr<GenerateQueue> queue) : queue_(std::move(queue)) {}

  void accepted(const std::vector<int64_t>& promptTokenIds, int64_t weightsVersion) override {
    version_ = weightsVersion;
    v1::GenerateResponse r;
    r.set_weights_version(version_);
    r.set_prompt_tokens(static_cast<int64_t>(promptTokenIds.size()));
    r.mutable_prompt_token_ids()->Add(promptTokenIds.begin(), promptTokenIds.end());
    queue_->push(std::move(r));
  }
  void token(int sample, const DrawnToken& token, std::string_view text) override {
    v1::GenerateResponse r = response(sample);
    v1::SampleDelta* d = r.mutable_samples(0);
    addToken(token, d->mutable_token_ids(), d->mutable_logprobs(), d->mutable_top_logprobs());
    d->set_text(std::string(text));
    queue_->push(std::move(r), convert::mergeGenerateResponses);
  }
  void finished(int sample, FinishReason reason, std::string_view text) override {
    v1::GenerateResponse r = response(sample);
    r.mutable_samples(0)->set_text(std::string(text));
    r.mutable_samples(0)->set_finish_reason(rollout::finishReasonName(reason));
    queue_->push(std::move(r), convert::mergeGenerateResponses);
  }
  void done() override { queue_->finish(grpc::Status::OK); }
  void failed(const Status& status) override { queue_->finish(convert::toGrpc(status)); }

 private:
  v1::GenerateResponse response(int sample) const {
    v1::GenerateResponse r;
    r.set_weights_version(version_);
    r.add_samples()->set_sample(sample);
    return r;
  }
  std::shared_ptr<GenerateQueue> queue_;
  int64_t version_ = 0;
};

class GenerateReactor final : public GenerateWriter {
 public:
  GenerateReactor(RolloutInbox& inbox, const planner::SamplingParams& defaults, const v1::GenerateRequest& request)
      : inbox_(inbox), queue_(std::make_shared<GenerateQueue>(this)) {
    auto prompt = readRequest(request, defaults, "");
    if (!prompt.isOk()) {
      queue_->finish(convert::toGrpc(prompt.status()));
      return;
    }
    handle_ = inbox_.submit(std::move(*prompt), std::make_shared<StreamSink>(queue_));
  }
  void OnWriteDone(bool ok) override {
    queue_->writeDone(ok);
    if (!ok) cancelRequest();
  }
  // The client went away: the request ends and its blocks are freed.
  void OnCancel() override {
    cancelRequest();
    queue_->finish(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    queue_->detach();
    delete this;
  }

 private:
  void cancelRequest() {
    if (handle_ && !cancelled_.exchange(true)) inbox_.cancel(handle_);
  }
  RolloutInbox& inbox_;
  std::shared_ptr<GenerateQueue> queue_;
  RolloutInbox::Handle handle_ = 0;
  std::atomic<bool> cancelled_{false};
};

// ---- GenerateBatch: several requests, answered together ----------------------------------------

class BatchCall final : public grpc::ServerUnaryReactor {
 public:
  BatchCall(RolloutInbox& inbox, v1::GenerateBatchResponse* response) : inbox_(inbox), response_(response) {}

  void start(const v1::GenerateBatchRequest& request, const planner::SamplingParams& defaults) {
    std::vector<rollout::ServedPrompt> prompts;
    for (int i = 0; i < request.prompts_size(); ++i) {
      auto prompt = readRequest(request.prompts(i), defaults, "prompts[" + std::to_string(i) + "]: ");
      if (!prompt.isOk()) return Finish(convert::toGrpc(prompt.status()));
      prompts.push_back(std::move(*prompt));
    }
    if (prompts.empty()) return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompts: none given"));
    std::lock_guard lock(mu_);
    results_.resize(prompts.size());
    open_ = static_cast<int>(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      results_[i].n = prompts[i].sampling.n;
      handles_.push_back(inbox_.submit(std::move(prompts[i]), std::make_shared<Sink>(this, static_cast<int>(i))));
    }
  }
  void OnCancel() override { failAll(Status(StatusCode::kCancelled, "the client cancelled the batch")); }
  void OnDone() override {
    std::unique_lock lock(mu_);
    doneCalled_ = true;
    if (open_ == 0) {
      lock.unlock();
      delete this;
    }
  }

 private:
  struct PromptResult {
    int64_t n = 1;
    std::vector<int64_t> promptTokenIds;
    int64_t version = 0;
    std::map<int, v1::SampleResult> samples;
  };
  struct Sink final : rollout::RequestSink {
    Sink(BatchCall* call, int index) : call(call), index(index) {}
    void accepted(const std::vector<int64_t>& promptTokenIds, int64_t weightsVersion) override {
      std::lock_guard lock(call->mu_);
      call->results_[index].promptTokenIds = promptTokenIds;
      call->results_[index].version = weightsVersion;
    }
    void token(int sample, const DrawnToken& token, std::string_view text) override {
      std::lock_guard lock(call->mu_);
      v1::SampleResult& s = call->results_[index].samples[sample];
      addToken(token, s.mutable_token_ids(), s.mutable_logprobs(), s.mutable_top_logprobs());
      s.mutable_text()->append(text);
    }
    void finished(int sample, FinishReason reason, std::string_view text) override {
      std::lock_guard lock(call->mu_);
      v1::SampleResult& s = call->results_[index].samples[sample];
      s.mutable_text()->append(text);
      s.set_finish_reason(rollout::finishReasonName(reason));
    }
    void done() override { call->ended(index, Status::ok()); }
    void failed(const Status& status) override { call->ended(index, status); }
    BatchCall* call;
    int index;
  };

  void failAll(const Status& why) {
    std::vector<RolloutInbox::Handle> handles;
    {
      std::lock_guard lock(mu_);
      if (!failure_) failure_ = why;
      handles = handles_;
    }
    for (RolloutInbox::Handle h : handles) inbox_.cancel(h);
  }

  // A request ended; the last one answers the call, and once gRPC is done too, frees it.
  void ended(int index, const Status& status) {
    if (!status.isOk()) failAll(status.withContext("prompts[" + std::to_string(index) + "]"));
    std::unique_lock lock(mu_);
    if (--open_ > 0) return;
    if (failure_) {
      Finish(convert::toGrpc(*failure_));
    } else {
      for (size_t i = 0; i < results_.size(); ++i)
        for (auto& [sample, s] : results_[i].samples) {
          s.set_prompt_index(static_cast<int>(i));
          s.set_sample(sample);
          const std::vector<int64_t>& prompt = results_[i].promptTokenIds;
          s.set_prompt_tokens(static_cast<int64_t>(prompt.size()));
          s.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
          s.set_weights_version(results_[i].version);
          *response_->add_results() = std::move(s);
        }
      Finish(grpc::Status::OK);
    }
    if (doneCalled_) {
      lock.unlock();
      delete this;
    }
  }

  RolloutInbox& inbox_;
  v1::GenerateBatchResponse* response_;
  std::mutex mu_;
  std::vector<PromptResult> results_;
  std::vector<RolloutInbox::Handle> handles_;
  std::optional<Status> failure_;
  int open_ = 0;
  bool doneCalled_ = false;
};

// Answers a unary call with the status the loop replies (from its thread).
rollout::StatusReply replyWith(grpc::ServerUnaryReactor* reactor, v1::RolloutStatus* response) {
  return [reactor, response](const StatusOr<RolloutStatusView>& status) {
    if (status.isOk()) toProto(*status, response);
    reactor->Finish(convert::toGrpc(status.status()));
  };
}

// A Generate call refused before it starts.
class RefusedGenerate final : public GenerateWriter {
 public:
  explicit RefusedGenerate(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// The planner relays the clients' calls here with the attempt's service token (loomd hands it to
// the rank as LOOM_SERVICE_TOKEN); anyone else who reaches the port is refused.
grpc::Status checkPlanner(const grpc::ServerContextBase& ctx, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(security::kAuthorizationKey);
  const std::string expected = security::kBearerPrefix + token;
  if (it == metadata.end() ||
      !security::constantTimeEquals(std::string_view(it->second.data(), it->second.size()), expected))
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this rank's RolloutService answers the planner only: call the planner's");
  return grpc::Status::OK;
}

}  // namespace

struct RolloutServer::Service final : v1::RolloutService::CallbackService {
  Service(RolloutInbox& inbox, planner::SamplingParams defaults, std::string token)
      : inbox(inbox), defaults(std::move(defaults)), token(std::move(token)) {}

  // A unary call's refusal, or nothing when the planner calls.
  grpc::ServerUnaryReactor* refused(grpc::CallbackServerContext* ctx) {
    grpc::Status status = checkPlanner(*ctx, token);
    if (status.ok()) return nullptr;
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  GenerateWriter* Generate(grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) override {
    if (grpc::Status status = checkPlanner(*ctx, token); !status.ok()) return new RefusedGenerate(status);
    return new GenerateReactor(inbox, defaults, *request);
  }
  grpc::ServerUnaryReactor* GenerateBatch(grpc::CallbackServerContext* ctx, const v1::GenerateBatchRequest* request,
                                          v1::GenerateBatchResponse* response) override {
    if (auto* refusal = refused(ctx)) return refusal;
    auto* call = new BatchCall(inbox, response);
    call->start(*request, defaults);
    return call;
  }
  grpc::ServerUnaryReactor* UpdateWeights(grpc::CallbackServerContext* ctx, const v1::UpdateWeightsRequest* request,
                                          v1::RolloutStatus* response) override {
    if (auto* refusal = refused(ctx)) return refusal;
    auto* reactor = ctx->DefaultReactor();
    if (request->checkpoint_dir().empty()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "checkpoint_dir: empty (a from_job_id is resolved by the planner: call it)"));
      return reactor;
    }
    if (request->version() < 0) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "version: must not be negative, got " + std::to_string(request->version())));
      return reactor;
    }
    inbox.updateWeights({.dir = request->checkpoint_dir(),
                         .abortInFlight = request->in_flight() == v1::IN_FLIGHT_ABORT,
                         .version = request->version(),
                         .reply = replyWith(reactor, response)});
    return reactor;
  }
  grpc::ServerUnaryReactor* Pause(grpc::CallbackServerContext* ctx, const v1::RolloutJobRequest*,
                                  v1::RolloutStatus* response) override {
    if (auto* refusal = refused(ctx)) return refusal;
    auto* reactor = ctx->DefaultReactor();
    inbox.setPaused({.pause = true, .reply = replyWith(reactor, response)});
    return reactor;
  }
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* ctx, const v1::RolloutJobRequest*,
                                   v1::RolloutStatus* response) override {
    if (auto* refusal = refused(ctx)) return refusal;
    auto* reactor = ctx->DefaultReactor();
    inbox.setPaused({.pause = false, .reply = replyWith(reactor, response)});
    return reactor;
  }
  grpc::ServerUnaryReactor* GetRolloutStatus(grpc::CallbackServerContext* ctx, const v1::RolloutJobRequest*,
                                             v1::RolloutStatus* response) override {
    if (auto* refusal = refused(ctx)) return refusal;
    auto* reactor = ctx->DefaultReactor();
    toProto(inbox.status(), response);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  RolloutInbox& inbox;
  planner::SamplingParams defaults;
  std::string token;  // LOOM_SERVICE_TOKEN; empty: a rank started without one answers anyone
};

StatusOr<std::unique_ptr<RolloutServer>> RolloutServer::start(const std::string& host, RolloutInbox& inbox,
                                                              const planner::SamplingParams& defaults) {
  std::unique_ptr<RolloutServer> server(new RolloutServer());
  const char* token = std::getenv("LOOM_SERVICE_TOKEN");
  server->service_ = std::make_unique<Service>(inbox, defaults, token ? token : "");
  const std::string bracketed = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  // TLS with the certificate the planner issued for this attempt (loomd writes it beside the
  // rank's log); a rank started by hand, without one, serves plain text.
  security::ServerTls tls;
  if (const char* cert = std::getenv("LOOM_SERVICE_CERT")) tls.certFile = cert;
  if (const char* key = std::getenv("LOOM_SERVICE_KEY")) tls.keyFile = key;
  auto credentials = security::serverCredentials(tls);
  if (!credentials.isOk())
    return Status(credentials.status().code(),
                  "rollout service: LOOM_SERVICE_CERT/LOOM_SERVICE_KEY: " + credentials.status().message());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(bracketed + ":0", *credentials, &port);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || port == 0)
    return unavailable("rollout service: cannot listen on {} (MASTER_ADDR: not an address of this host?)", host);
  server->address_ = bracketed + ":" + std::to_string(port);
  return server;
}

RolloutServer::~RolloutServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace loom::worker

extern "C" loom::worker::StartRolloutServiceFn loom_rollout_service() {
  return [](const std::string& host, loom::rollout::RolloutInbox& inbox,
            const loom::planner::SamplingParams& defaults) -> loom::StatusOr<loom::worker::RolloutServing> {
    ASSIGN_OR_RETURN(std::unique_ptr<loom::worker::RolloutServer> server,
                     loom::worker::RolloutServer::start(host, inbox, defaults));
    loom::worker::RolloutServing serving{.server = nullptr, .address = server->address()};
    serving.server = std::shared_ptr<loom::worker::RolloutServer>(std::move(server));
    return serving;
  };
}
