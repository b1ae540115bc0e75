// loomd: the node daemon. Dials the planner (--planner) or runs it in process (--standalone),
// then launches and supervises the rank processes the planner places on this node.
#include <csignal>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "common/files.h"
#include "common/logging.h"
#include "common/signals.h"
#include "common/version.h"
#include "daemon/daemon.h"
#include "daemon/gpus.h"
#include "daemon/node_metrics.h"
#include "kernels/loader.h"
#include "common/security/credential_flags.h"
#include "common/security/tokens.h"
#include "planner/planner_server.h"
#include "planner/server_flags.h"

namespace {

std::string hostName() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loomd: Loom's node daemon"};
  app.set_version_flag("--version", std::string("loomd ") + loom::kVersion, "print the version and exit");
  loom::daemon::DaemonOptions options;
  std::string plannerAddress, listenAddress = "127.0.0.1:7450", logLevel = "info";
  bool standalone = false;
  double nodeTimeoutS = 15;
  options.slots = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  options.nodeId = hostName();
  options.workerPath = loom::files::selfDir() + "/loom-worker";

  auto* plannerOpt = app.add_option("--planner", plannerAddress, "the planner's address (host:port)");
  auto* standaloneOpt = app.add_flag("--standalone", standalone, "run the planner in this process");
  plannerOpt->excludes(standaloneOpt);
  app.add_option("--listen", listenAddress, "with --standalone: where the planner serves gRPC (port 0: any)")
      ->capture_default_str();
  std::string httpListen = "127.0.0.1:7451";
  auto* httpOpt = app.add_option("--http-listen", httpListen,
                                 "with --standalone: address of /metrics, the JSON API and the web page (port 0: "
                                 "any free one; \"none\": no HTTP)")
                      ->capture_default_str();
  std::string metricsListen;
  app.add_option("--metrics-listen", metricsListen,
                 "serve this node's Prometheus /metrics here (host:port; port 0: any free one)");
  std::string metricsTokenFile;
  loom::daemon::NodeMetricsAccess metricsAccess;
  bool metricsInsecure = false;
  app.add_option("--metrics-token-file", metricsTokenFile,
                 "a file holding the token scrapers of /metrics present (Authorization: Bearer); needed beyond "
                 "loopback");
  app.add_option("--metrics-tls-cert", metricsAccess.tlsCertFile, "serve /metrics over HTTPS with this certificate");
  app.add_option("--metrics-tls-key", metricsAccess.tlsKeyFile, "the --metrics-tls-cert's private key");
  app.add_flag("--metrics-insecure", metricsInsecure,
               "serve /metrics beyond loopback to anyone, without --metrics-token-file (logs a warning)");
  app.add_option("--state-dir", options.stateDir, "directory for rank records, logs and (standalone) the job database")
      ->required();
  app.add_option("--slots", options.slots, "ranks this node runs at once")->capture_default_str();
  app.add_option("--node-id", options.nodeId, "this node's name")->capture_default_str();
  app.add_option("--address", options.address,
                 "the address other nodes reach this one at (default: as the planner sees it; standalone: 127.0.0.1)");
  app.add_option("--worker", options.workerPath, "the loom-worker binary")->capture_default_str();
  std::string runAs;
  app.add_option("--run-as", runAs,
                 "run ranks as this unprivileged user (loomd as root); their scratch directories and the report "
                 "socket become theirs, and --state-dir must let them in");
  std::string gpuList = "auto";
  app.add_option("--gpus", gpuList,
                 "the GPUs this node offers, by CUDA index: each rank of a cuda job takes one, seen through "
                 "CUDA_VISIBLE_DEVICES (0,1,2,3; an index twice shares that GPU between two ranks; none: not "
                 "counted; auto: those /proc/driver/nvidia/gpus lists)")
      ->capture_default_str();
  options.kernelDirs = loom::kernels::defaultKernelDirectories();
  app.add_option("--kernel-dir", options.kernelDirs,
                 "a directory of kernel plugins that jobs may name in kernels.plugins (repeatable; replaces the "
                 "default, the plugin directories beside loomd)")
      ->capture_default_str();
  app.add_option("--node-timeout", nodeTimeoutS, "with --standalone: seconds before a silent node's ranks are lost")
      ->capture_default_str();
  app.add_option("--log-level", logLevel, "trace, debug, info, warn or error")->capture_default_str();
  bool drainOnSigterm = false;
  double drainTimeoutS = 60;
  app.add_flag("--drain-on-sigterm", drainOnSigterm,
               "on SIGTERM, preempt this node's ranks (train ranks checkpoint) and wait for them before stopping; "
               "without it they keep running for the next loomd to re-adopt");
  app.add_option("--drain-timeout", drainTimeoutS, "with --drain-on-sigterm: seconds to wait for the ranks")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  // The planner's credentials with --planner; with --standalone, the in-process planner's flags.
  loom::security::CredentialFlags credentialFlags;
  loom::security::addCredentialFlags(app, credentialFlags, "this node's");
  loom::planner::PlannerServerOptions plannerOptions;
  loom::planner::addSecurityFlags(app, plannerOptions);
  CLI11_PARSE(app, argc, argv);
  if (!standalone && plannerAddress.empty()) {
    std::fprintf(stderr, "loomd: give --planner HOST:PORT, or --standalone\n");
    return 2;
  }
  const bool servesPlanner = plannerOptions.tls.enabled() || !plannerOptions.tokensFile.empty() ||
                             !plannerOptions.tenantsFile.empty() || plannerOptions.insecure ||
                             plannerOptions.reflection;
  if (!standalone && servesPlanner) {
    std::fprintf(stderr, "loomd: --tls-cert, --tokens, --tenants, --insecure and --reflection are the planner's: they need "
                         "--standalone (the planner's credentials: --ca, --cert, --key, --token-file)\n");
    return 2;
  }
  if (!standalone && httpOpt->count() > 0) {
    std::fprintf(stderr, "loomd: --http-listen serves the planner's web page: it needs --standalone (the node's own "
                         "/metrics: --metrics-listen)\n");
    return 2;
  }

  if (!metricsListen.empty() && metricsTokenFile.empty() && !metricsInsecure &&
      !loom::security::isLoopback(metricsListen)) {
    std::fprintf(stderr, "loomd: --metrics-listen %s is beyond loopback: give --metrics-token-file (the token "
                         "Prometheus presents), or --metrics-insecure to serve it to anyone\n",
                 metricsListen.c_str());
    return 2;
  }
  if (!metricsTokenFile.empty()) {
    auto token = loom::security::readTokenFile(metricsTokenFile);
    if (!token.isOk()) {
      std::fprintf(stderr, "loomd: --metrics-token-file: %s\n", token.status().message().c_str());
      return 2;
    }
    metricsAccess.token = std::move(token).value();
  }

  if (gpuList == "auto") {
    options.gpus = loom::daemon::detectGpus();
  } else {
    auto gpus = loom::daemon::parseGpuList(gpuList);
    if (!gpus.isOk()) {
      std::fprintf(stderr, "loomd: %s\n", gpus.status().message().c_str());
      return 2;
    }
    options.gpus = std::move(gpus).value();
  }

  if (!runAs.empty()) {
    auto user = loom::process::lookupUser(runAs);
    if (!user.isOk()) {
      std::fprintf(stderr, "loomd: --run-as: %s\n", user.status().message().c_str());
      return 2;
    }
    if (::geteuid() != 0 && user->uid != ::geteuid()) {
      std::fprintf(stderr, "loomd: --run-as %s needs loomd to run as root\n", runAs.c_str());
      return 2;
    }
    options.runAs = std::move(user).value();
  }

  loom::initLogging("loomd", logLevel);
  const sigset_t signals = loom::blockTerminationSignals();  // before any thread starts

  loom::SystemClock clock;
  std::unique_ptr<loom::planner::PlannerServer> planner;
  std::shared_ptr<grpc::Channel> channel;
  if (standalone) {
    if (options.address.empty()) options.address = "127.0.0.1";
    plannerOptions.listenAddress = listenAddress;
    plannerOptions.httpListenAddress = httpListen == "none" ? "" : httpListen;
    plannerOptions.httpRequired = httpOpt->count() > 0;
    plannerOptions.planner.stateDir = options.stateDir + "/planner";
    plannerOptions.planner.nodeTimeoutMs = static_cast<int64_t>(nodeTimeoutS * 1000);
    plannerOptions.planner.nodeHeartbeatIntervalMs = std::min<int64_t>(1000, plannerOptions.planner.nodeTimeoutMs / 3);
    auto started = loom::planner::PlannerServer::start(plannerOptions, &clock);
    if (!started.isOk()) {
      spdlog::error("{}", started.status().toString());
      return 1;
    }
    planner = std::move(started).value();
    auto inProcess = planner->inProcessChannel(loom::security::Role::kNode);
    if (!inProcess.isOk()) {
      spdlog::error("{}", inProcess.status().toString());
      return 1;
    }
    channel = std::move(inProcess).value();
    auto written = loom::files::writeFileAtomic(options.stateDir + "/planner.address", planner->boundAddress() + "\n");
    if (!written.isOk()) spdlog::warn("{}", written.toString());
    spdlog::info("standalone: planner serving on {}", planner->boundAddress());
    if (plannerOptions.tokensFile.empty())
      spdlog::info("standalone: an admin's token is in {}/admin.token (loomctl --token-file)",
                   plannerOptions.planner.stateDir);
    if (const std::string http = planner->httpAddress(); !http.empty()) {
      written = loom::files::writeFileAtomic(options.stateDir + "/http.address", http + "\n");
      if (!written.isOk()) spdlog::warn("{}", written.toString());
      spdlog::info("standalone: web page on http://{}/ (Prometheus: /metrics)", http);
    }
  } else {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2'000);
    auto credentials = loom::security::loadCredentials(credentialFlags);
    if (!credentials.isOk()) {
      spdlog::error("{}", credentials.status().toString());
      return 1;
    }
    if (credentials->token.empty() && credentials->certPem.empty())
      spdlog::warn("no credentials for the planner: give --token-file (a node token) or --cert and --key");
    channel = loom::security::makeChannel(plannerAddress, *credentials, args);
  }

  auto daemon = loom::daemon::Daemon::start(options, channel, &clock);
  if (!daemon.isOk()) {
    spdlog::error("{}", daemon.status().toString());
    return 1;
  }
  std::unique_ptr<loom::daemon::NodeMetricsServer> metrics;
  if (!metricsListen.empty()) {
    auto served = loom::daemon::NodeMetricsServer::start(metricsListen, (*daemon).get(), metricsAccess);
    if (!served.isOk()) {
      spdlog::error("{}", served.status().toString());
      (*daemon)->shutdown();
      return 1;
    }
    metrics = std::move(served).value();
    auto written = loom::files::writeFileAtomic(options.stateDir + "/metrics.address", metrics->boundAddress() + "\n");
    if (!written.isOk()) spdlog::warn("{}", written.toString());
    spdlog::info("node metrics on {}://{}/metrics{}", metricsAccess.tlsCertFile.empty() ? "http" : "https",
                 metrics->boundAddress(), metricsAccess.token.empty() ? "" : " (scrapers present --metrics-token-file)");
    if (metricsInsecure && metricsAccess.token.empty())
      spdlog::warn("--metrics-insecure: anyone who reaches {} reads this node's metrics", metrics->boundAddress());
  }
  const std::string signal = loom::awaitTerminationSignal(signals);
  if (drainOnSigterm && signal == "SIGTERM") {
    spdlog::info("received SIGTERM: preempting this node's ranks, then stopping (--drain-on-sigterm)");
    (*daemon)->drain();
    if (!(*daemon)->awaitNoLiveRanks(static_cast<int64_t>(drainTimeoutS * 1000)))
      spdlog::warn("ranks still run after {:g} s (--drain-timeout); stopping without them", drainTimeoutS);
  } else {
    spdlog::info("received {}: stopping (ranks keep running; a restarted loomd re-adopts them)", signal);
  }
  metrics.reset();
  (*daemon)->shutdown();
  if (planner) planner->shutdown();
  return 0;
}
