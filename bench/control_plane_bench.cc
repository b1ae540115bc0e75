// Control-plane benchmark, side by side with torchrun in the same run:
//   1. time from CreateJob to all N local ranks RUNNING (loomd --standalone, real processes),
//   2. GetJob latency (p50 / p99) and throughput under concurrent clients,
//   3. `torchrun --nproc-per-node N` (the torch wheel's) from start to the first line of user
//      code in every rank.
// Usage: loom-bench-control-plane [--ranks 8] [--repeats 5] [--clients 8] [--calls 2000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/loom_client.h"
#include "common/files.h"
#include "common/process.h"
#include "common/security/tokens.h"

namespace {

using Clock = std::chrono::steady_clock;
using loom::v1::JobUpdate;

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

std::string probeSpec(int ranks) {
  return fmt::format(R"({{"name": "bench", "kind": "probe", "resources": {{"ranks": {}}},
                          "probe": {{"ticks": 1, "tick_ms": 1}}}})",
                     ranks);
}

std::string makeTempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "loom-bench-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp");
  return pattern;
}

// Loom: CreateJob -> the RUNNING update (every rank reported ready), seen by the client.
std::vector<double> loomStartup(loom::client::LoomClient& client, int ranks, int repeats) {
  std::vector<double> out;
  for (int i = 0; i < repeats; ++i) {
    auto start = Clock::now();
    auto created = client.createJob(probeSpec(ranks));
    if (!created.isOk()) throw std::runtime_error(created.status().toString());
    double runningMs = -1;
    (void)client.watchJob(created->job().id(), [&](const JobUpdate& u) {
      if (runningMs < 0 && u.job().state() == loom::v1::RUNNING) runningMs = msSince(start);
      return true;
    });
    out.push_back(runningMs);
  }
  return out;
}

// torchrun: process start -> the last rank's first line of user code (a timestamp file).
std::vector<double> torchrunStartup(const std::string& python, int ranks, int repeats) {
  std::string dir = makeTempDir();
  std::string script = dir + "/first_line.py";
  std::ofstream(script) << "import os, time; open(os.path.join(os.environ['OUTDIR'], os.environ['RANK']), 'w')"
                           ".write(repr(time.time()))\n";
  std::vector<double> out;
  for (int i = 0; i < repeats; ++i) {
    std::string outDir = fmt::format("{}/run{}", dir, i);
    std::filesystem::create_directories(outDir);
    auto wallStart = std::chrono::system_clock::now();
    auto pid = loom::process::spawn({.executable = python,
                                     .args = {"-m", "torch.distributed.run", "--nproc-per-node",
                                              std::to_string(ranks), script},
                                     .env = {{"OUTDIR", outDir}},
                                     .logPath = dir + "/torchrun.log",
                                     .workingDir = "",
                                     .newSession = true});
    if (!pid.isOk()) throw std::runtime_error(pid.status().toString());
    int status = 0;
    ::waitpid(*pid, &status, 0);
    double last = 0;
    int seen = 0;
    for (const auto& f : loom::files::listFiles(outDir)) {
      double t = std::stod(loom::files::readFile(f).value());
      last = std::max(last, t);
      ++seen;
    }
    if (seen != ranks) throw std::runtime_error(fmt::format("torchrun: {} of {} ranks ran; see {}", seen, ranks, dir));
    double start = std::chrono::duration<double>(wallStart.time_since_epoch()).count();
    out.push_back((last - start) * 1000.0);
  }
  std::filesystem::remove_all(dir);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom control-plane benchmark (against torchrun)"};
  int ranks = 8, repeats = 5, clients = 8, calls = 2000;
  std::string python = LOOM_PYTHON;  // the build's: scripts/setup installed torch into it
  app.add_option("--ranks", ranks)->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  app.add_option("--clients", clients, "concurrent GetJob callers")->capture_default_str();
  app.add_option("--calls", calls, "GetJob calls per caller")->capture_default_str();
  app.add_option("--python", python, "the Python whose torchrun is measured")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::string dir = makeTempDir();
  auto loomd = loom::process::spawn({.executable = loom::files::selfDir() + "/loomd",
                                     .args = {"--standalone", "--listen", "127.0.0.1:0", "--state-dir", dir, "--slots",
                                              std::to_string(ranks), "--log-level", "warn"},
                                     .env = {},
                                     .logPath = dir + "/loomd.log",
                                     .workingDir = "",
                                     .newSession = true});
  if (!loomd.isOk()) {
    std::fprintf(stderr, "%s\n", loomd.status().toString().c_str());
    return 1;
  }
  std::string address;
  for (int i = 0; i < 200 && address.empty(); ++i) {
    auto text = loom::files::readFile(dir + "/planner.address");
    if (text.isOk() && !text->empty()) address = text->substr(0, text->find('\n'));
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // The admin's token the standalone planner generated into its state directory.
  loom::security::ClientCredentials credentials;
  auto token = loom::security::readTokenFile(dir + "/planner/admin.token");
  if (!token.isOk()) {
    std::fprintf(stderr, "%s\n", token.status().toString().c_str());
    return 1;
  }
  credentials.token = *token;
  loom::client::LoomClient client(address, credentials);
  (void)client.awaitReady(std::chrono::seconds(10));

  loomStartup(client, ranks, 1);  // warm-up: page cache, first connection
  auto loomMs = loomStartup(client, ranks, repeats);
  auto torchMs = torchrunStartup(python, ranks, repeats);

  // GetJob under concurrent callers, each with its own channel.
  auto jobs = client.listJobs(loom::v1::ListJobsRequest());
  const std::string jobId = jobs->jobs(0).id();
  std::vector<std::vector<double>> perClient(clients);
  std::vector<std::thread> threads;
  auto loadStart = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", c);  // a channel (connection) per caller
      loom::client::LoomClient own(loom::security::makeChannel(address, credentials, args));
      perClient[c].reserve(calls);
      for (int i = 0; i < calls; ++i) {
        auto t = Clock::now();
        if (!own.getJob(jobId).isOk()) std::abort();
        perClient[c].push_back(msSince(t));
      }
    });
  }
  for (auto& t : threads) t.join();
  double loadSeconds = msSince(loadStart) / 1000.0;
  std::vector<double> latencies;
  for (auto& v : perClient) latencies.insert(latencies.end(), v.begin(), v.end());

  loom::process::signalGroup(*loomd, SIGTERM);
  ::waitpid(*loomd, nullptr, 0);
  std::filesystem::remove_all(dir);

  double loomMedian = percentile(loomMs, 0.5), torchMedian = percentile(torchMs, 0.5);
  std::printf("| what | median | min | max |\n|---|---|---|---|\n");
  std::printf("| Loom: CreateJob -> %d ranks RUNNING | %.1f ms | %.1f ms | %.1f ms |\n", ranks, loomMedian,
              percentile(loomMs, 0), percentile(loomMs, 1));
  std::printf("| torchrun --nproc-per-node %d -> first line of user code in every rank | %.1f ms | %.1f ms | %.1f ms |\n",
              ranks, torchMedian, percentile(torchMs, 0), percentile(torchMs, 1));
  std::printf("\nLoom starts %d ranks %.1fx faster than torchrun (medians of %d runs).\n\n", ranks,
              torchMedian / loomMedian, repeats);
  std::printf("GetJob, %d concurrent clients x %d calls: p50 %.3f ms, p99 %.3f ms, %.0f calls/s\n", clients, calls,
              percentile(latencies, 0.5), percentile(latencies, 0.99), latencies.size() / loadSeconds);
  return 0;
}
