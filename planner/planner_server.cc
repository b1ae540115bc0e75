#include "planner/planner_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <spdlog/spdlog.h>

#include "common/files.h"
#include "planner/access_control.h"
#include "planner/grpc_services.h"
#include "planner/planner_metrics.h"
#include "planner/rollout_router.h"
#include "planner/web_server.h"

namespace loom::planner {

namespace {

// Plain text stays on loopback unless the operator says otherwise.
Status checkPlainText(const PlannerServerOptions& options) {
  if (options.tls.enabled() || options.insecure) return Status::ok();
  if (!security::isLoopback(options.listenAddress))
    return failedPrecondition("--listen {}: serving plain text beyond loopback needs --insecure (or TLS: --tls-cert "
                              "and --tls-key)",
                              options.listenAddress);
  if (!options.httpListenAddress.empty() && !security::isLoopback(options.httpListenAddress))
    return failedPrecondition("--http-listen {}: serving plain text beyond loopback needs --insecure (or TLS: "
                              "--tls-cert and --tls-key)",
                              options.httpListenAddress);
  return Status::ok();
}

// Linking gRPC's reflection library registers its plugin with every server builder of the
// process (a static initializer): this option takes it out again when reflection is off.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const auto& plugin) { return plugin->name() == "proto_server_reflection"; });
  }
};

}  // namespace

StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::start(const PlannerServerOptions& options, const Clock* clock) {
  RETURN_IF_ERROR(checkPlainText(options));
  ASSIGN_OR_RETURN(auto credentials, security::serverCredentials(options.tls));
  TenantPolicies tenants;
  if (!options.tenantsFile.empty()) {
    ASSIGN_OR_RETURN(std::string text, files::readFile(options.tenantsFile));
    ASSIGN_OR_RETURN(tenants, parseTenantsFile(text, options.tenantsFile));
  }
  PlannerOptions plannerOptions = options.planner;
  for (const auto& [name, policy] : tenants) plannerOptions.quotas[name] = policy.quota;
  std::unique_ptr<PlannerServer> server(new PlannerServer());
  // The core first: it takes the state directory's lock before anything is written there.
  ASSIGN_OR_RETURN(server->core_, PlannerCore::create(plannerOptions, clock));
  std::string tokensFile = options.tokensFile;
  if (tokensFile.empty()) {
    ASSIGN_OR_RETURN(tokensFile, ensureGeneratedTokens(options.planner.stateDir));
  }
  ASSIGN_OR_RETURN(server->access_, AccessControl::create(tokensFile));
  server->gate_ = std::make_unique<CallGate>(server->access_.get(), server->core_.get(), std::move(tenants));
  const bool plainTextBeyondLoopback = !options.tls.enabled() && !security::isLoopback(options.listenAddress);
  if (plainTextBeyondLoopback)
    spdlog::warn("--insecure: serving plain text on {}: tokens, specs and logs cross the network unencrypted",
                 options.listenAddress);
  server->jobService_ = std::make_unique<JobServiceImpl>(server->core_.get(), server->gate_.get());
  server->nodeService_ =
      std::make_unique<NodeServiceImpl>(server->core_.get(), server->gate_.get(), plainTextBeyondLoopback);
  server->rolloutRouter_ = std::make_unique<RolloutRouter>(server->core_.get(), server->gate_.get());
  server->metrics_ = std::make_unique<PlannerMetrics>();
  server->core_->setPlacementObserver(
      [metrics = server->metrics_.get()](double seconds) { metrics->observePlacementWait(seconds); });

  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  builder.AddListeningPort(options.listenAddress, credentials, &port);
  builder.RegisterService(server->jobService_.get());
  builder.RegisterService(server->nodeService_.get());
  builder.RegisterService(server->rolloutRouter_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(server->metrics_->interceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Daemons hold one stream for days: keepalives find a dead peer without waiting for TCP.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || port == 0)
    return unavailable("cannot listen on {} (in use, or not an address of this host)", options.listenAddress);
  auto colon = options.listenAddress.rfind(':');
  server->boundAddress_ = options.listenAddress.substr(0, colon) + ":" + std::to_string(port);
  if (!options.httpListenAddress.empty()) {
    auto web = WebServer::start(options.httpListenAddress, server->core_.get(), server->metrics_.get(),
                                server->access_.get(), options.tls);
    if (web.isOk()) {
      server->web_ = std::move(web).value();
    } else if (options.httpRequired) {
      return web.status();
    } else {
      spdlog::warn("{}: serving no web page or /metrics (--http-listen to choose another address)",
                   web.status().message());
    }
  }
  return server;
}

PlannerServer::~PlannerServer() { shutdown(); }

std::string PlannerServer::httpAddress() const { return web_ ? web_->boundAddress() : std::string(); }

StatusOr<std::shared_ptr<grpc::Channel>> PlannerServer::inProcessChannel(security::Role role) {
  ASSIGN_OR_RETURN(std::string token, security::generateToken());
  access_->addToken(token, {.user = role == security::Role::kNode ? "*" : "local",
                             .role = role,
                             .credential = "in-process token"});
  return server_->experimental().InProcessChannelWithInterceptors(grpc::ChannelArguments(),
                                                                   security::tokenInterceptors(token));
}

void PlannerServer::shutdown() {
  if (web_) web_->shutdown();
  if (!server_) return;
  // Streams end first, so the server's shutdown does not wait on them; the core's loop stops
  // last, so that calls still in flight get their answers.
  core_->closeStreams();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
  core_->shutdown();
}

}  // namespace loom::planner
