#include "planner/planner_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <spdlog/spdlog.h>

#include "planner/grpc_services.h"
#include "planner/planner_metrics.h"
#include "planner/rollout_router.h"
#include "planner/web_server.h"

namespace loom::planner {

StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::start(const PlannerServerOptions& options, const Clock* clock) {
  std::unique_ptr<PlannerServer> server(new PlannerServer());
  ASSIGN_OR_RETURN(server->core_, PlannerCore::create(options.planner, clock));
  server->jobService_ = std::make_unique<JobServiceImpl>(server->core_.get());
  server->nodeService_ = std::make_unique<NodeServiceImpl>(server->core_.get());
  server->rolloutRouter_ = std::make_unique<RolloutRouter>(server->core_.get());
  server->metrics_ = std::make_unique<PlannerMetrics>();
  server->core_->setPlacementObserver(
      [metrics = server->metrics_.get()](double seconds) { metrics->observePlacementWait(seconds); });

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listenAddress, grpc::InsecureServerCredentials(), &port);
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
    auto web = WebServer::start(options.httpListenAddress, server->core_.get(), server->metrics_.get());
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

std::shared_ptr<grpc::Channel> PlannerServer::inProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
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
