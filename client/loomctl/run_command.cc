#include <csignal>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "client/loom_client.h"
#include "client/loomctl/commands.h"
#include "client/loomctl/progress.h"
#include "common/files.h"
#include "common/logging.h"
#include "common/security/tokens.h"
#include "daemon/daemon.h"
#include "daemon/gpus.h"
#include "planner/job_spec.h"
#include "planner/planner_server.h"

namespace loom::loomctl {

namespace {

StatusOr<std::string> makeRunDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/loom-run-XXXXXX";
  if (!::mkdtemp(pattern.data())) return errnoStatus("creating a state directory from " + pattern);
  return pattern;
}

}  // namespace

int runCommand(const GlobalOptions& g, const RunOptions& options) {
  // Ctrl-C cancels the job (its ranks are stopped) instead of leaving them behind: the signals go
  // to a thread of ours, blocked everywhere else before any thread exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR2);  // our own "stop listening"
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto text = readSpecFile(options.file, g.overrides);
  if (!text.isOk()) return reportError(text.status());
  auto spec = planner::parseJobSpec(*text);
  if (!spec.isOk()) return reportError(spec.status().withContext(options.file));

  std::string stateDir = options.stateDir;
  if (stateDir.empty()) {
    auto made = makeRunDir();
    if (!made.isOk()) return reportError(made.status());
    stateDir = *made;
  }
  initLogging("loom", "error");

  SystemClock clock;
  planner::PlannerServerOptions plannerOptions;
  plannerOptions.listenAddress = "127.0.0.1:0";
  plannerOptions.httpListenAddress = "127.0.0.1:0";  // the job's web page, for as long as it runs
  plannerOptions.planner.stateDir = stateDir + "/planner";
  auto server = planner::PlannerServer::start(plannerOptions, &clock);
  if (!server.isOk()) return reportError(server.status());

  daemon::DaemonOptions daemonOptions{.stateDir = stateDir, .nodeId = "local", .address = "127.0.0.1",
                                      .slots = options.slots > 0 ? options.slots : spec->ranks,
                                      .workerPath = files::selfDir() + "/loom-worker", .tickMs = 50};
  daemonOptions.gpus = daemon::detectGpus();
  auto nodeChannel = (*server)->inProcessChannel(security::Role::kNode);
  auto clientChannel = (*server)->inProcessChannel(security::Role::kAdmin);
  if (!nodeChannel.isOk() || !clientChannel.isOk())
    return reportError(nodeChannel.isOk() ? clientChannel.status() : nodeChannel.status());
  auto node = daemon::Daemon::start(daemonOptions, *nodeChannel, &clock);
  if (!node.isOk()) return reportError(node.status());

  client::LoomClient client(*clientChannel);
  auto created = client.createJob(*text);
  if (!created.isOk()) return reportError(created.status().withContext(options.file));
  const std::string jobId = created->job().id();
  std::fprintf(stderr, "job %s: %d rank%s on this machine (state and logs in %s)\n", jobId.c_str(), spec->ranks,
               spec->ranks == 1 ? "" : "s", stateDir.c_str());
  if (const std::string http = (*server)->httpAddress(); !http.empty()) {
    // The link carries the run's admin token, as Jupyter's does: the page takes it out of the
    // address and keeps it for the tab. The planner listens on loopback only.
    auto token = security::readTokenFile(stateDir + "/planner/admin.token");
    const std::string query = token.isOk() ? "?token=" + *token : "";
    std::fprintf(stderr, "web page: http://%s/%s#/jobs/%s\n", http.c_str(), query.c_str(), jobId.c_str());
  }

  std::thread canceller([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGUSR2) return;
    std::fprintf(stderr, "\nloomctl: %s: cancelling job %s\n", sig == SIGINT ? "interrupted" : "terminated",
                 jobId.c_str());
    (void)client.cancelJob(jobId, "loomctl run was interrupted");
  });

  ProgressPrinter printer(stderr);
  v1::Job last;
  Status watched = client.watchJob(jobId, [&](const v1::JobUpdate& update) {
    last = update.job();
    if (g.format == OutputFormat::kJson) {  // JSON Lines: one update per line
      std::puts(toJsonLine(update).c_str());
      std::fflush(stdout);
    } else {
      printer.onUpdate(update);
    }
    return true;
  });
  printer.finish();

  // A failed job's other ranks are still being stopped: wait for them (their grace period).
  (*node)->awaitNoLiveRanks(spec->gracePeriodMs + 5000);
  pthread_kill(canceller.native_handle(), SIGUSR2);
  canceller.join();
  (*node)->shutdown();
  (*server)->shutdown();

  if (!watched.isOk()) return reportError(watched);
  std::fprintf(stderr, "logs: %s/jobs/%s/attempt-%d/\n", stateDir.c_str(), jobId.c_str(), last.attempt());
  return exitCodeFor(last.state());
}

}  // namespace loom::loomctl
