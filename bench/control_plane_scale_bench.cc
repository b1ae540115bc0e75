// Control-plane scale: a real loom-planner, N simulated node daemons and M jobs.
//
// Each simulated daemon holds a real Attach stream of its own connection, registers with its
// slots, heartbeats at the interval the planner asks for, and answers every launch as loomd's
// ranks would report: started, ready, exited 0 (rank 0's node first names the master endpoint)
// — no processes. C clients submit M probe jobs of 1 to 8 ranks meanwhile, each as soon as the
// last is answered, or with --submit-rate S the clients together S jobs a second on a fixed
// schedule (below the planner's most, its latencies are those of a planner with time to spare).
// Reported:
//   - attach: all N nodes registered, seconds;
//   - placement: CreateJob called -> the launch order at a node, p50 / p99 / max;
//   - jobs: all M succeeded, seconds and jobs per second;
//   - GetJob and ListJobs (a page of 100) latency p50 / p99 from C callers while jobs run: each
//     calls as soon as its last call is answered, or with --get-rate R the callers together start
//     R calls a second on a fixed schedule (a caller that falls behind calls at once until it is
//     on time again); a call's latency is from when it is sent, not when it was due, as the
//     callers share the machine's cores and a due time includes their own wake-up;
//   - heartbeats sent per second over the run;
//   - the planner's CPU seconds and peak resident memory (/proc);
//   - a planner restart with M jobs stored: seconds until GetJob answers.
// --check exits non-zero unless every job succeeded and the restarted planner knows them all
// (the CI form runs 100 nodes and 1,000 jobs); it never judges a time.
// Usage: loom-bench-control-plane-scale [--nodes 1000] [--jobs 10000] [--slots 8] [--clients 8]
//        [--list-every 10] [--get-rate 0] [--submit-rate 0] [--check]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "client/loom_client.h"
#include "common/files.h"
#include "common/process.h"
#include "common/security/credentials.h"
#include "common/security/tokens.h"
#include "loom/v1/node.grpc.pb.h"
#include "bench/bench_stats.h"

namespace {

using Clock = std::chrono::steady_clock;
using loom::v1::NodeMessage;
using loom::v1::PlannerMessage;

using loom::bench::msSince;
using loom::bench::percentile;

// Waits until `seconds` after `start`: the fixed schedules of --submit-rate and --get-rate.
void sleepUntil(Clock::time_point start, double seconds) {
  std::this_thread::sleep_until(start +
                                std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "loom-bench-control-plane-scale: %s\n", what.c_str());
  std::exit(1);
}

// When each job's first launch order reached a node (the placement's end).
class LaunchClock {
 public:
  void launched(const std::string& jobId) {
    std::lock_guard lock(mu_);
    launchedAt_.try_emplace(jobId, Clock::now());
  }
  std::map<std::string, Clock::time_point> take() {
    std::lock_guard lock(mu_);
    return launchedAt_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, Clock::time_point> launchedAt_;
};

// One simulated loomd: an Attach stream, writes queued one at a time as gRPC's reactor wants.
class SimulatedNode final : public grpc::ClientBidiReactor<NodeMessage, PlannerMessage> {
 public:
  SimulatedNode(std::shared_ptr<grpc::Channel> channel, std::string nodeId, int slots, LaunchClock* clock,
                std::atomic<int64_t>* heartbeats)
      : stub_(loom::v1::NodeService::NewStub(std::move(channel))),
        nodeId_(std::move(nodeId)),
        clock_(clock),
        heartbeats_(heartbeats) {
    NodeMessage hello;
    auto* r = hello.mutable_register_();
    r->set_node_id(nodeId_);
    r->set_hostname(nodeId_);
    r->set_address("127.0.0.1");
    r->set_slots(slots);
    r->set_instance_id(nodeId_ + "-sim");
    stub_->async()->Attach(&context_, this);
    enqueue(std::move(hello));
    StartRead(&in_);
    StartCall();
  }

  bool registered() const { return registered_.load(); }
  int64_t heartbeatMs() const { return heartbeatMs_.load(); }

  void heartbeat() {
    NodeMessage m;
    m.mutable_heartbeat();
    enqueue(std::move(m));
    heartbeats_->fetch_add(1);
  }

  void stop() { context_.TryCancel(); }

  // Blocks until the stream has ended.
  void await() {
    std::unique_lock lock(mu_);
    doneCv_.wait(lock, [&] { return done_; });
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    handle(in_);
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (!ok) return;
    queue_.pop_front();
    writeNext();
  }

  void OnDone(const grpc::Status&) override {
    std::lock_guard lock(mu_);
    done_ = true;
    doneCv_.notify_all();
  }

 private:
  void handle(const PlannerMessage& m) {
    if (m.has_registered()) {
      heartbeatMs_ = m.registered().heartbeat_interval_ms();
      registered_ = true;
    } else if (m.has_launch()) {
      const auto& launch = m.launch();
      clock_->launched(launch.job_id());
      if (launch.pick_master_port()) {
        NodeMessage endpoint;
        auto* e = endpoint.mutable_master_endpoint();
        e->set_job_id(launch.job_id());
        e->set_attempt(launch.attempt());
        e->set_address("127.0.0.1");
        e->set_port(29500);
        enqueue(std::move(endpoint));
      }
      for (const auto& assignment : launch.ranks()) {
        for (auto event : {loom::v1::RANK_STARTED, loom::v1::RANK_READY, loom::v1::RANK_EXITED}) {
          NodeMessage report;
          auto* r = report.mutable_rank_report();
          r->set_job_id(launch.job_id());
          r->set_attempt(launch.attempt());
          r->set_rank(assignment.rank());
          r->set_event(event);
          r->set_pid(100000 + assignment.rank());
          r->set_step(event == loom::v1::RANK_EXITED ? 1 : 0);
          enqueue(std::move(report));
        }
      }
    } else if (m.has_log_request()) {
      NodeMessage data;
      data.mutable_log_data()->set_request_id(m.log_request().request_id());
      data.mutable_log_data()->set_done(true);
      enqueue(std::move(data));
    }
    // Kill and Release need nothing: the simulated ranks have already exited.
  }

  void enqueue(NodeMessage m) {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(m));
    writeNext();
  }

  void writeNext() {  // with mu_ held
    if (writing_ || queue_.empty() || done_) return;
    writing_ = true;
    StartWrite(&queue_.front());
  }

  std::unique_ptr<loom::v1::NodeService::Stub> stub_;
  grpc::ClientContext context_;
  std::string nodeId_;
  LaunchClock* clock_;
  std::atomic<int64_t>* heartbeats_;
  PlannerMessage in_;
  std::mutex mu_;
  std::condition_variable doneCv_;
  std::deque<NodeMessage> queue_;
  bool writing_ = false;
  bool done_ = false;
  std::atomic<bool> registered_{false};
  std::atomic<int64_t> heartbeatMs_{1000};
};

struct Planner {
  int pid = -1;
  std::string address;
};

Planner startPlanner(const std::string& dir) {
  std::filesystem::remove(dir + "/planner.address");
  auto pid = loom::process::spawn({.executable = loom::files::selfDir() + "/loom-planner",
                                   .args = {"--listen", "127.0.0.1:0", "--http-listen", "none", "--state-dir", dir,
                                            "--node-timeout", "60", "--log-level", "warn"},
                                   .env = {},
                                   .logPath = dir + "/planner.log",
                                   .workingDir = "",
                                   .newSession = true});
  if (!pid.isOk()) die(pid.status().toString());
  return {.pid = *pid, .address = ""};
}

// The address the planner bound (--listen port 0), from the file it writes once it serves.
std::string awaitAddress(const std::string& dir) {
  for (int i = 0; i < 1200; ++i) {
    auto text = loom::files::readFile(dir + "/planner.address");
    if (text.isOk() && !text->empty()) return text->substr(0, text->find('\n'));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  die("the planner wrote no address; see " + dir + "/planner.log");
}

void stopPlanner(int pid) {
  loom::process::signalGroup(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
}

std::string probeSpec(int index, int ranks) {
  return fmt::format(R"({{"name": "scale-{}", "kind": "probe", "resources": {{"ranks": {}}},
                          "probe": {{"ticks": 1, "tick_ms": 1}}, "restart": {{"max_restarts": 0}}}})",
                     index, ranks);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom control-plane scale benchmark: simulated daemons against a real planner"};
  int nodes = 1000, jobs = 10000, slots = 8, clients = 8, listEvery = 10;
  double getRate = 0, submitRate = 0;
  bool check = false;
  std::string stateDir;
  app.add_option("--nodes", nodes, "simulated node daemons")->capture_default_str();
  app.add_option("--jobs", jobs, "probe jobs of 1 to 8 ranks")->capture_default_str();
  app.add_option("--slots", slots, "slots per node")->capture_default_str();
  app.add_option("--clients", clients, "concurrent submitters, then GetJob and ListJobs callers")->capture_default_str();
  app.add_option("--list-every", listEvery, "each caller's ListJobs per this many GetJob calls (0: none)")
      ->capture_default_str();
  app.add_option("--get-rate", getRate,
                 "GetJob calls a second over all callers (0: each calls as soon as answered)")
      ->capture_default_str();
  app.add_option("--submit-rate", submitRate,
                 "jobs submitted a second over all clients (0: each as soon as answered)")
      ->capture_default_str();
  app.add_option("--state-dir", stateDir, "the planner's (default: a new temporary directory, removed after)");
  app.add_flag("--check", check, "exit non-zero unless every job succeeded and a restarted planner knows them all");
  CLI11_PARSE(app, argc, argv);

  // A connection per simulated node: raise the open-file limit to what the system allows.
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);

  const bool ownDir = stateDir.empty();
  if (ownDir) {
    std::string pattern = (std::filesystem::temp_directory_path() / "loom-scale-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) die("mkdtemp");
    stateDir = pattern;
  }
  Planner planner = startPlanner(stateDir);
  planner.address = awaitAddress(stateDir);
  auto adminToken = loom::security::readTokenFile(stateDir + "/admin.token");
  auto nodeToken = loom::security::readTokenFile(stateDir + "/node.token");
  if (!adminToken.isOk() || !nodeToken.isOk()) die("no generated tokens in " + stateDir);
  const loom::security::ClientCredentials admin{.token = *adminToken};
  loom::client::LoomClient client(planner.address, admin);
  if (!client.awaitReady(std::chrono::seconds(20)).isOk()) die("the planner does not answer");

  // 1. Attach every node.
  LaunchClock launches;
  std::atomic<int64_t> heartbeats{0};
  std::vector<std::unique_ptr<SimulatedNode>> simulated;
  const auto attachStart = Clock::now();
  for (int i = 0; i < nodes; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", i);  // a connection of its own, as a daemon has
    args.SetMaxReceiveMessageSize(-1);
    simulated.push_back(std::make_unique<SimulatedNode>(
        loom::security::makeChannel(planner.address, {.token = *nodeToken}, args), fmt::format("sim-{:04d}", i),
        slots, &launches, &heartbeats));
  }
  for (const auto& n : simulated) {
    while (!n->registered()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double attachSeconds = msSince(attachStart) / 1000;

  std::atomic<bool> running{true};
  std::thread heartbeater([&] {
    const auto interval = std::chrono::milliseconds(simulated.front()->heartbeatMs());
    while (running) {
      const auto next = Clock::now() + interval;
      for (const auto& n : simulated) n->heartbeat();
      std::this_thread::sleep_until(next);
    }
  });
  const auto runStart = Clock::now();
  const int64_t heartbeatsBefore = heartbeats.load();

  // 2. Submit the jobs from `clients` callers; meanwhile, and after, GetJob and ListJobs.
  std::vector<std::pair<std::string, Clock::time_point>> submitted(static_cast<size_t>(jobs));
  std::atomic<int> nextJob{0};
  std::atomic<int> failedSubmits{0};
  std::vector<std::thread> submitters;
  const auto submitStart = Clock::now();
  for (int c = 0; c < clients; ++c) {
    submitters.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", nodes + c);
      loom::client::LoomClient own(loom::security::makeChannel(planner.address, admin, args));
      std::mt19937 rng(static_cast<unsigned>(c));
      for (int i; (i = nextJob.fetch_add(1)) < jobs;) {
        // With a rate, job i is due at submitStart + i / rate, whichever client takes it.
        if (submitRate > 0) sleepUntil(submitStart, i / submitRate);
        const auto asked = Clock::now();
        auto created = own.createJob(probeSpec(i, 1 + static_cast<int>(rng() % 8)));
        if (!created.isOk()) {
          failedSubmits.fetch_add(1);
          continue;
        }
        submitted[static_cast<size_t>(i)] = {created->job().id(), asked};
      }
    });
  }
  std::vector<double> getMs, listMs;
  std::mutex latencyMu;
  std::vector<std::thread> readers;
  std::atomic<bool> reading{true};
  for (int c = 0; c < clients; ++c) {
    readers.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", nodes + clients + c);
      loom::client::LoomClient own(loom::security::makeChannel(planner.address, admin, args));
      std::vector<double> gets, lists;
      // With a rate, caller c's call i is due at start + (i + c / clients) * clients / rate.
      const auto start = Clock::now();
      for (int i = 0; reading; ++i) {
        if (getRate > 0) sleepUntil(start, (i + static_cast<double>(c) / clients) * clients / getRate);
        const int k = nextJob.load() > 0 ? (c * 7919 + i) % std::min(nextJob.load(), jobs) : 0;
        const std::string id = submitted[static_cast<size_t>(k)].first;
        if (!id.empty()) {
          const auto sent = Clock::now();
          (void)own.getJob(id);
          gets.push_back(msSince(sent));
        }
        if (listEvery > 0 && i % listEvery == 0) {
          loom::v1::ListJobsRequest page;
          page.set_page_size(100);
          auto t = Clock::now();
          (void)own.listJobs(page);
          lists.push_back(msSince(t));
        }
      }
      std::lock_guard lock(latencyMu);
      getMs.insert(getMs.end(), gets.begin(), gets.end());
      listMs.insert(listMs.end(), lists.begin(), lists.end());
    });
  }
  for (auto& t : submitters) t.join();

  // Every job ends: the simulated ranks exit as soon as they start.
  int succeeded = 0, ended = 0;
  for (const auto& [id, at] : submitted) {
    if (id.empty()) continue;
    auto job = client.awaitJob(id, std::chrono::minutes(10));
    ++ended;
    if (job.isOk() && job->state() == loom::v1::SUCCEEDED) ++succeeded;
  }
  const double runSeconds = msSince(runStart) / 1000;
  reading = false;
  for (auto& t : readers) t.join();
  const double heartbeatsPerSecond = static_cast<double>(heartbeats.load() - heartbeatsBefore) / runSeconds;
  running = false;
  heartbeater.join();

  std::vector<double> placementMs;
  auto launchedAt = launches.take();
  for (const auto& [id, at] : submitted) {
    auto launched = launchedAt.find(id);
    if (!id.empty() && launched != launchedAt.end())
      placementMs.push_back(std::max(0.0, std::chrono::duration<double, std::milli>(launched->second - at).count()));
  }
  const loom::process::Usage usage = loom::process::usage(planner.pid).value_or(loom::process::Usage{});

  // 3. Restart the planner with every job stored.
  for (auto& n : simulated) n->stop();
  for (auto& n : simulated) n->await();
  stopPlanner(planner.pid);
  const auto restartStart = Clock::now();
  Planner again = startPlanner(stateDir);
  again.address = awaitAddress(stateDir);
  loom::client::LoomClient restarted(again.address, admin);
  (void)restarted.awaitReady(std::chrono::seconds(60));
  const std::string lastId = submitted.back().first;
  while (!restarted.getJob(lastId).isOk() && msSince(restartStart) < 120'000)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double restartSeconds = msSince(restartStart) / 1000;
  int known = 0;
  std::string pageToken;
  do {
    loom::v1::ListJobsRequest page;
    page.set_page_size(1000);
    page.set_page_token(pageToken);
    auto listed = restarted.listJobs(page);
    if (!listed.isOk()) break;
    known += listed->jobs_size();
    pageToken = listed->next_page_token();
  } while (!pageToken.empty());
  stopPlanner(again.pid);
  if (ownDir) std::filesystem::remove_all(stateDir);

  const std::string pace = submitRate > 0 ? fmt::format(", {:.0f} submitted a second", submitRate) : "";
  std::printf("| %d simulated nodes of %d slots, %d probe jobs of 1-8 ranks%s, %d clients | value |\n|---|---|\n",
              nodes, slots, jobs, pace.c_str(), clients);
  std::printf("| all nodes attached | %.2f s |\n", attachSeconds);
  std::printf("| jobs succeeded | %d of %d (%d submits refused) |\n", succeeded, jobs, failedSubmits.load());
  std::printf("| all jobs done | %.1f s (%.0f jobs/s) |\n", runSeconds, succeeded / runSeconds);
  std::printf("| placement: CreateJob called -> launch at a node | p50 %.1f ms, p99 %.1f ms, max %.1f ms |\n",
              percentile(placementMs, 0.5), percentile(placementMs, 0.99), percentile(placementMs, 1));
  const std::string rate = getRate > 0 ? fmt::format("{:.0f} a second", getRate) : "as fast as answered";
  std::printf("| GetJob under load (%zu calls, %s) | p50 %.2f ms, p99 %.2f ms |\n", getMs.size(), rate.c_str(),
              percentile(getMs, 0.5), percentile(getMs, 0.99));
  std::printf("| ListJobs, a page of 100, under load (%zu calls) | p50 %.2f ms, p99 %.2f ms |\n", listMs.size(),
              percentile(listMs, 0.5), percentile(listMs, 0.99));
  std::printf("| heartbeats handled | %.0f /s |\n", heartbeatsPerSecond);
  std::printf("| planner CPU, peak memory | %.1f s, %.0f MB |\n", usage.cpuSeconds,
              static_cast<double>(usage.peakResidentBytes) / (1 << 20));
  std::printf("| planner restart with %d jobs stored -> GetJob answers | %.2f s (%d jobs listed) |\n", known,
              restartSeconds, known);
  if (check && (succeeded != jobs || known < jobs)) {
    std::fprintf(stderr, "loom-bench-control-plane-scale: %d of %d jobs succeeded, %d known after the restart\n",
                 succeeded, jobs, known);
    return 1;
  }
  return 0;
}
