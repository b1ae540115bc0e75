// loom-planner: the central service. Holds the jobs (SQLite in --state-dir), the registry of the
// node daemons that attach to it, and the decisions: placement, the job state machine, restarts.
#include <csignal>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "common/files.h"
#include "common/logging.h"
#include "common/signals.h"
#include "common/version.h"
#include "planner/planner_server.h"
#include "planner/server_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"loom-planner: Loom's central job service"};
  app.set_version_flag("--version", std::string("loom-planner ") + loom::kVersion, "print the version and exit");
  loom::planner::PlannerServerOptions options;
  std::string logLevel = "info";
  double nodeTimeoutS = 15;
  app.add_option("--listen", options.listenAddress, "address to serve gRPC on (port 0: any free port)")
      ->capture_default_str();
  options.httpListenAddress = "127.0.0.1:7451";
  auto* httpOpt = app.add_option("--http-listen", options.httpListenAddress,
                                 "address of /metrics, the JSON API and the web page (port 0: any free one; "
                                 "\"none\": no HTTP)")
                      ->capture_default_str();
  app.add_option("--state-dir", options.planner.stateDir, "directory for the job database")->required();
  app.add_option("--node-timeout", nodeTimeoutS, "seconds a node may be silent before its ranks count as lost")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--log-level", logLevel, "trace, debug, info, warn or error")->capture_default_str();
  loom::planner::addSecurityFlags(app, options);
  CLI11_PARSE(app, argc, argv);
  options.planner.nodeTimeoutMs = static_cast<int64_t>(nodeTimeoutS * 1000);
  if (options.httpListenAddress == "none") options.httpListenAddress.clear();
  options.httpRequired = httpOpt->count() > 0;
  options.planner.nodeHeartbeatIntervalMs = std::min<int64_t>(1000, options.planner.nodeTimeoutMs / 3);

  loom::initLogging("planner", logLevel);
  const sigset_t signals = loom::blockTerminationSignals();  // before any thread starts

  loom::SystemClock clock;
  auto server = loom::planner::PlannerServer::start(options, &clock);
  if (!server.isOk()) {
    spdlog::error("{}", server.status().toString());
    return 1;
  }
  const std::string& address = (*server)->boundAddress();
  auto written = loom::files::writeFileAtomic(options.planner.stateDir + "/planner.address", address + "\n");
  if (!written.isOk()) spdlog::warn("{}", written.toString());
  spdlog::info("serving {} on {} (state in {})", options.tls.enabled() ? "TLS" : "plain text", address,
               options.planner.stateDir);
  if (options.tokensFile.empty())
    spdlog::info("credentials: {0}/admin.token (loomctl --token-file), {0}/node.token (loomd --token-file)",
                 options.planner.stateDir);
  if (const std::string http = (*server)->httpAddress(); !http.empty()) {
    written = loom::files::writeFileAtomic(options.planner.stateDir + "/http.address", http + "\n");
    if (!written.isOk()) spdlog::warn("{}", written.toString());
    spdlog::info("web page on http://{}/ (Prometheus: /metrics)", http);
  }

  spdlog::info("received {}, shutting down", loom::awaitTerminationSignal(signals));
  (*server)->shutdown();
  return 0;
}
