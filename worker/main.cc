// loom-worker: one rank of a job. Started by loomd with the rank environment; runs its part of
// the job and exits 0 on success. Its exit code is also written to LOOM_RANK_DIR/exit_status, so
// a loomd that restarted meanwhile learns how it ended.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>

#include "common/files.h"
#include "common/process.h"
#include "common/version.h"
#include "planner/job_spec.h"
#include "worker/job_runners.h"
#include "worker/plan_file.h"
#include "worker/preemption.h"
#include "worker/rank_context.h"
#include "worker/report_client.h"
#include "worker/torch_runtime.h"

namespace {

int finish(const loom::worker::RankContext& context, int code) {
  (void)loom::files::writeFileAtomic(context.rankDir + "/exit_status", std::to_string(code) + "\n");
  return code;
}

// `loom-worker --version`: this build and the libtorch it loads.
int printVersion() {
  auto torch = loom::worker::loadTorchRuntime();
  if (!torch.isOk()) {
    std::fprintf(stderr, "loom-worker %s: %s\n", loom::kVersion, torch.status().message().c_str());
    return 1;
  }
  std::printf("loom-worker %s, %s\n", loom::kVersion, (*torch)->describe().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) return printVersion();
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, which the writer reports naming
  // the file, instead of killing the rank with SIGXFSZ mid-checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  auto context = loom::worker::RankContext::fromEnvironment();
  if (!context.isOk()) {
    std::fprintf(stderr, "loom-worker: %s\n", context.status().message().c_str());
    return 2;
  }
  const auto& ctx = *context;
  auto fail = [&](const loom::Status& s) {
    std::fprintf(stderr, "loom-worker: job %s rank %d: %s\n", ctx.jobId.c_str(), ctx.rank, s.toString().c_str());
    return finish(ctx, 1);
  };

  auto specText = loom::files::readFile(ctx.specPath);
  if (!specText.isOk()) return fail(specText.status());
  auto spec = loom::planner::parseJobSpec(*specText);
  if (!spec.isOk()) return fail(spec.status().withContext(ctx.specPath));
  const auto& runner = loom::worker::runnerFor(spec->kind);
  std::optional<loom::planner::Plan> plan;
  if (loom::planner::jobKindInfo(spec->kind).hasPlan) {
    auto read = loom::worker::readPlanFile(ctx.planPath);
    if (!read.isOk()) return fail(read.status().withContext("plan"));
    plan = std::move(read).value();
  }
  auto reports = loom::worker::ReportClient::connect(ctx);
  if (!reports.isOk()) return fail(reports.status());

  std::printf("rank %d/%d (local %d) of job %s attempt %d on node %s, master %s:%d\n", ctx.rank, ctx.worldSize,
              ctx.localRank, ctx.jobId.c_str(), ctx.attempt, ctx.nodeId.c_str(), ctx.masterAddr.c_str(),
              ctx.masterPort);
  (*reports)->ready("");

  loom::Status result = runner.run(ctx, *spec, plan ? &*plan : nullptr, **reports);
  if (loom::worker::isPreemptedStatus(result)) {
    std::fprintf(stderr, "loom-worker: job %s rank %d: %s\n", ctx.jobId.c_str(), ctx.rank, result.message().c_str());
    (*reports)->failing(result.message());
    return finish(ctx, loom::process::kExitPreempted);
  }
  if (!result.isOk()) {
    (*reports)->failing(result.message());
    return fail(result);
  }
  return finish(ctx, 0);
}
