// Control-plane benchmark, side by side with torchrun in the same run:
//   1. time from CreateJob to all N local ranks RUNNING (loomd --standalone, real processes),
//   2. GetJob latency (p50 / p99) and throughput under concurrent clients,
//   3. `torchrun --nproc-per-node N` (the torch wheel's) from start to the first line of user
//      code in every rank,
//   4. the cost of security: GetJob latency and SubmitJob throughput over plain text with a
//      token (loopback's default), TLS with a token, and mutual TLS with a client certificate,
//      each against a planner of its own in the same run.
// Usage: loom-bench-control-plane [--ranks 8] [--repeats 5] [--clients 8] [--calls 2000] [--submits 200]
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
#include "common/security/certificates.h"
#include "common/security/tokens.h"
#include "bench/bench_stats.h"

namespace {

using Clock = std::chrono::steady_clock;
using loom::v1::JobUpdate;

using loom::bench::msSince;
using loom::bench::percentile;

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

// A loomd --standalone in `dir` with `extraArgs`; its address once it serves.
struct Standalone {
  int pid = -1;
  std::string address;
};
Standalone startStandalone(const std::string& dir, int slots, std::vector<std::string> extraArgs = {}) {
  std::vector<std::string> args{"--standalone", "--listen", "127.0.0.1:0", "--http-listen", "none", "--state-dir", dir,
                                "--slots", std::to_string(slots), "--log-level", "warn"};
  args.insert(args.end(), extraArgs.begin(), extraArgs.end());
  auto pid = loom::process::spawn({.executable = loom::files::selfDir() + "/loomd", .args = args, .env = {},
                                   .logPath = dir + "/loomd.log", .workingDir = "", .newSession = true});
  if (!pid.isOk()) throw std::runtime_error(pid.status().toString());
  Standalone out{.pid = *pid, .address = ""};
  for (int i = 0; i < 200 && out.address.empty(); ++i) {
    auto text = loom::files::readFile(dir + "/planner.address");
    if (text.isOk() && !text->empty()) out.address = text->substr(0, text->find('\n'));
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (out.address.empty()) throw std::runtime_error("loomd wrote no address; see " + dir + "/loomd.log");
  return out;
}

void stopStandalone(const Standalone& s) {
  loom::process::signalGroup(s.pid, SIGTERM);
  ::waitpid(s.pid, nullptr, 0);
}

loom::security::ClientCredentials tokenOf(const std::string& dir) {
  auto token = loom::security::readTokenFile(dir + "/planner/admin.token");
  if (!token.isOk()) throw std::runtime_error(token.status().toString());
  return {.token = *token};
}

struct Load {
  std::vector<double> getMs;  // every GetJob's latency
  double getPerSecond = 0;
  double submitsPerSecond = 0;
};

// `clients` concurrent callers, each on its own channel (connection): `calls` GetJobs each, then
// `submits` CreateJobs shared among them (jobs too large to place: they wait, and cost no ranks).
Load measure(const std::string& address, const loom::security::ClientCredentials& credentials, int clients,
             int calls, int submits, int slots) {
  std::vector<std::unique_ptr<loom::client::LoomClient>> own;
  for (int c = 0; c < clients; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);
    own.push_back(std::make_unique<loom::client::LoomClient>(loom::security::makeChannel(address, credentials, args)));
  }
  const std::string waiting =
      fmt::format(R"({{"name": "wait", "kind": "probe", "resources": {{"ranks": {}}}}})", slots + 1);
  auto first = own[0]->createJob(waiting);
  if (!first.isOk()) throw std::runtime_error(first.status().toString());
  const std::string jobId = first->job().id();
  for (auto& c : own) (void)c->getJob(jobId);  // connections (and handshakes) before the clock
  Load load;
  std::vector<std::vector<double>> perClient(clients);
  std::vector<std::thread> threads;
  auto start = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      perClient[c].reserve(calls);
      for (int i = 0; i < calls; ++i) {
        auto t = Clock::now();
        if (!own[c]->getJob(jobId).isOk()) std::abort();
        perClient[c].push_back(msSince(t));
      }
    });
  }
  for (auto& t : threads) t.join();
  load.getPerSecond = clients * calls / (msSince(start) / 1000.0);
  for (auto& v : perClient) load.getMs.insert(load.getMs.end(), v.begin(), v.end());
  threads.clear();
  start = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (int i = c; i < submits; i += clients)
        if (!own[c]->createJob(waiting).isOk()) std::abort();
    });
  }
  for (auto& t : threads) t.join();
  load.submitsPerSecond = submits / (msSince(start) / 1000.0);
  return load;
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
  int ranks = 8, repeats = 5, clients = 8, calls = 2000, submits = 200;
  std::string python = LOOM_PYTHON;  // the build's: scripts/setup installed torch into it
  app.add_option("--ranks", ranks)->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  app.add_option("--clients", clients, "concurrent GetJob callers")->capture_default_str();
  app.add_option("--calls", calls, "GetJob calls per caller")->capture_default_str();
  app.add_option("--python", python, "the Python whose torchrun is measured")->capture_default_str();
  app.add_option("--submits", submits, "CreateJob calls, among the callers, for each transport")->capture_default_str();
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

  // The cost of security: each transport against a fresh planner, the same load.
  struct Row {
    const char* what;
    Load load;
  };
  std::vector<Row> rows;
  {
    const std::string plain = makeTempDir();
    Standalone s = startStandalone(plain, ranks);
    rows.push_back({"plain text, bearer token (loopback's default)", measure(s.address, tokenOf(plain), clients, calls,
                                                                            submits, ranks)});
    stopStandalone(s);
    std::filesystem::remove_all(plain);
  }
  {
    const std::string tls = makeTempDir();
    auto ca = loom::security::createCertificateAuthority("bench CA", 1);
    auto server = loom::security::issueCertificate(
        *ca, {.subject = {.commonName = "loom-planner"}, .altNames = {"127.0.0.1"}, .serverAuth = true, .days = 1});
    auto client = loom::security::issueCertificate(
        *ca, {.subject = {.commonName = "bench", .organizationalUnit = "admin"}, .clientAuth = true, .days = 1});
    if (!ca.isOk() || !server.isOk() || !client.isOk()) throw std::runtime_error("certificates");
    (void)loom::files::writeFileAtomic(tls + "/ca.crt", ca->certificate);
    (void)loom::files::writeFileAtomic(tls + "/planner.crt", server->certificate);
    (void)loom::files::writeFileAtomic(tls + "/planner.key", server->privateKey, 0600);
    Standalone s = startStandalone(tls, ranks, {"--tls-cert", tls + "/planner.crt", "--tls-key", tls + "/planner.key",
                                                "--client-ca", tls + "/ca.crt"});
    loom::security::ClientCredentials withToken = tokenOf(tls);
    withToken.caPem = ca->certificate;
    rows.push_back({"TLS, bearer token", measure(s.address, withToken, clients, calls, submits, ranks)});
    const loom::security::ClientCredentials withCertificate{
        .caPem = ca->certificate, .certPem = client->certificate, .keyPem = client->privateKey};
    rows.push_back({"mutual TLS, client certificate", measure(s.address, withCertificate, clients, calls, submits,
                                                             ranks)});
    stopStandalone(s);
    std::filesystem::remove_all(tls);
  }
  std::printf("\nThe cost of security: %d concurrent clients, %d GetJob calls each, then %d CreateJob calls\n\n",
              clients, calls, submits);
  std::printf("| transport | GetJob p50 | GetJob p99 | GetJob calls/s | CreateJob jobs/s | calls/s vs plain text |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %.3f ms | %.3f ms | %.0f | %.0f | %.2f |\n", r.what, percentile(r.load.getMs, 0.5),
                percentile(r.load.getMs, 0.99), r.load.getPerSecond, r.load.submitsPerSecond,
                r.load.getPerSecond / rows[0].load.getPerSecond);
  return 0;
}
