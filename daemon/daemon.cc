#include "daemon/daemon.h"
#include "daemon/gpus.h"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/files.h"
#include "common/process.h"

namespace loom::daemon {

namespace {

// Binds `port` (0: any) on every address and closes it again: the port it got, or an error.
StatusOr<int> bindAndRelease(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoStatus("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Status s = errnoStatus("picking a free port");
    ::close(fd);
    return s;
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

// The first port the kernel hands out on its own (ip_local_port_range), 32768 by default.
int ephemeralPortsStart() {
  auto text = files::readFile("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (text.isOk() && std::sscanf(text->c_str(), "%d", &low) == 1 && low > 1024) return low;
  return 32768;
}

// A free TCP port for the attempt's MASTER_PORT, which rank 0 binds a moment later. Taken at
// random below the ephemeral range: a port there is never handed to another process's outgoing
// connection or bind(0) in between (torchrun's bind-0 pick can be, and then the attempt fails
// with "Address already in use"), and two daemons collide only by picking the same of ~20,000.
StatusOr<int> pickFreePort() {
  static thread_local std::mt19937 random(std::random_device{}());
  const int high = ephemeralPortsStart();
  if (high > 12000) {
    std::uniform_int_distribution<int> below(10000, high - 1);
    for (int tries = 0; tries < 16; ++tries) {
      auto port = bindAndRelease(below(random));
      if (port.isOk()) return port;
    }
  }
  return bindAndRelease(0);
}

// A served rollout's rank 0 listens with the certificate the planner issued for its attempt:
// written beside its log, readable by the rank's user only.
Status writeServiceCertificate(const std::string& rankDir, const security::PemPair& pair,
                               const std::optional<process::RunAs>& runAs) {
  for (const auto& [name, text, mode] : {std::tuple{"service.crt", &pair.certificate, 0644u},
                                         std::tuple{"service.key", &pair.privateKey, 0600u}}) {
    const std::string path = rankDir + "/" + name;
    RETURN_IF_ERROR(files::writeFileAtomic(path, *text, mode));
    if (runAs && ::chown(path.c_str(), runAs->uid, runAs->gid) != 0)
      return errnoStatus("chown " + path + " to " + runAs->name);
  }
  return Status::ok();
}

// The worker writes its exit code here just before exiting, so that a daemon which was not its
// parent (it restarted meanwhile) still learns how a re-adopted rank ended.
std::optional<int> readExitStatus(const std::string& rankDir) {
  auto text = files::readFile(rankDir + "/exit_status");
  if (!text.isOk()) return std::nullopt;
  try {
    return std::stoi(*text);
  } catch (...) {
    return std::nullopt;
  }
}

// The polite stop: `signal` (SIGTERM: a preemption; SIGINT: any other stop) to the rank's
// process group, and SIGCONT, since a stopped process keeps the signal pending until it runs.
void askToStop(const RankRecord& r, int signal, const std::string& why) {
  spdlog::info("job {} rank {} (pid {}): {} ({})", r.jobId, r.rank, r.pid, signal == SIGTERM ? "SIGTERM" : "SIGINT",
               why);
  process::signalGroup(r.pid, signal);
  process::signalGroup(r.pid, SIGCONT);
}

}  // namespace

Status DaemonOptions::validate() const {
  if (stateDir.empty()) return invalidArgument("--state-dir: required");
  if (nodeId.empty()) return invalidArgument("--node-id: must not be empty");
  if (slots <= 0) return invalidArgument("--slots: must be at least 1, got {}", slots);
  if (workerPath.empty() || ::access(workerPath.c_str(), X_OK) != 0)
    return invalidArgument("--worker: {} is not an executable file", workerPath);
  return Status::ok();
}

StatusOr<std::unique_ptr<Daemon>> Daemon::start(const DaemonOptions& options, std::shared_ptr<grpc::Channel> planner,
                                                const Clock* clock) {
  RETURN_IF_ERROR(options.validate());
  RETURN_IF_ERROR(files::makeDirs(options.stateDir + "/ranks"));
  RETURN_IF_ERROR(files::makeDirs(options.stateDir + "/jobs"));
  std::unique_ptr<Daemon> d(new Daemon(options, clock));
  Daemon* self = d.get();
  // The link exists (not yet started) before recovery, which reports how re-found ranks ended.
  d->link_ = std::make_unique<PlannerLink>(std::move(planner), self);
  Status recovered;
  d->loop_->runSync([&] { recovered = self->recoverRecords(); });
  RETURN_IF_ERROR(recovered);
  ASSIGN_OR_RETURN(d->reports_, ReportSocket::open(options.stateDir + "/report.sock", [self](WorkerMessage m) {
                     self->loop_->post([self, m = std::move(m)] { self->onWorkerMessage(m); });
                   }));
  if (options.runAs) {
    // The ranks' user, and only it (and root), may send reports.
    const std::string& socket = d->reports_->path();
    if (::chown(socket.c_str(), options.runAs->uid, options.runAs->gid) != 0 || ::chmod(socket.c_str(), 0600) != 0)
      return errnoStatus("giving the report socket " + socket + " to " + options.runAs->name);
  }
  d->logs_ = std::make_unique<LogServer>(
      options.stateDir + "/jobs",
      [self](const std::string& jobId, int attempt, int rank) {
        bool live = false;
        self->loop_->runSync([&] {
          auto it = self->ranks_.find(RankRecord{.jobId = jobId, .attempt = attempt, .rank = rank}.key());
          live = it != self->ranks_.end() && !it->second.exited;
        });
        return live;
      },
      [self](const LogData& data) { self->link_->sendLogData(data); });
  d->loop_->runEvery(std::chrono::milliseconds(options.tickMs), [self] { self->tick(); });
  d->link_->start();
  spdlog::info("node {}: {} slots, state in {}", options.nodeId, options.slots, options.stateDir);
  return d;
}

Daemon::Daemon(const DaemonOptions& options, const Clock* clock)
    : options_(options), clock_(clock), loop_(std::make_unique<EventLoop>("loomd")) {
  std::random_device random;
  instanceId_ = fmt::format("{}-{:08x}", ::getpid(), random());
}

Daemon::~Daemon() { shutdown(); }

void Daemon::shutdown() {
  if (link_) link_->stop();
  logs_.reset();
  reports_.reset();
  loop_->stop();
}

bool Daemon::awaitNoLiveRanks(int64_t timeoutMs) {
  const int64_t deadline = clock_->steadyMs() + timeoutMs;
  for (;;) {
    int live = 0;
    loop_->runSync([&] {
      for (const auto& [key, r] : ranks_) live += !r.exited;
    });
    if (live == 0) return true;
    if (clock_->steadyMs() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Daemon::drain() {
  if (link_->connected()) {
    link_->sendDraining();
    return;
  }
  loop_->runSync([&] {
    for (auto& [key, r] : ranks_) {
      if (r.exited || r.reapedStatus) continue;
      askToStop(r, SIGTERM, "loomd is stopping; no planner to tell");
    }
  });
}

std::string Daemon::attemptDir(const std::string& jobId, int attempt) const {
  return fmt::format("{}/jobs/{}/attempt-{}", options_.stateDir, jobId, attempt);
}

std::string Daemon::recordPath(const RankRecord& record) const {
  return options_.stateDir + "/ranks/" + record.key() + ".json";
}

void Daemon::persist(const RankRecord& record) {
  Status s = files::writeFileAtomic(recordPath(record), recordToJson(record));
  if (!s.isOk()) spdlog::error("rank {} of job {}: cannot persist its record: {}", record.rank, record.jobId, s.toString());
}

// Ranks this daemon had before it restarted: live ones are re-adopted (watched through /proc,
// since they are no longer our children), ended ones are reported with what can be known.
Status Daemon::recoverRecords() {
  const int64_t now = clock_->steadyMs();
  for (const auto& path : files::listFiles(options_.stateDir + "/ranks", ".json")) {
    auto text = files::readFile(path);
    if (!text.isOk()) continue;
    auto record = recordFromJson(*text);
    if (!record.isOk()) {
      spdlog::warn("ignoring unreadable rank record {}: {}", path, record.status().message());
      continue;
    }
    RankRecord r = std::move(record).value();
    r.child = false;
    r.lastHeartbeatMs = now;
    if (!r.exited) {
      if (process::isAlive(r.pid, r.startTime)) {
        spdlog::info("re-adopted rank {} of job {} attempt {} (pid {})", r.rank, r.jobId, r.attempt, r.pid);
      } else if (auto code = readExitStatus(r.rankDir)) {
        markExited(r, *code, 0, "");
      } else {
        markExited(r, 255, 0, "ended while loomd was down; exit status unknown");
      }
    }
    ranks_[r.key()] = std::move(r);
  }
  return Status::ok();
}

NodeRegistration Daemon::registration() {
  NodeRegistration reg{.nodeId = options_.nodeId, .hostname = "", .address = options_.address,
                       .slots = options_.slots, .ranks = {}, .instanceId = instanceId_,
                       .gpus = static_cast<int>(options_.gpus.size())};
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  reg.hostname = host;
  loop_->runSync([&] {
    for (const auto& [key, r] : ranks_) reg.ranks.push_back(r.lastReport);
    counters_.plannerConnected = true;
    counters_.plannerRegistrations += 1;
  });
  return reg;
}

void Daemon::snapshot(std::function<void(NodeSnapshot)> done) {
  loop_->post([this, done = std::move(done)] {
    NodeSnapshot out = counters_;
    out.nodeId = options_.nodeId;
    out.slots = options_.slots;
    for (const auto& [key, r] : ranks_) {
      if (!r.exited && r.pid > 0)
        out.liveRanks.push_back({.jobId = r.jobId, .attempt = r.attempt, .rank = r.rank, .pid = r.pid, .step = r.step});
    }
    done(std::move(out));
  });
}

void Daemon::report(RankRecord& record, RankEvent event, const std::string& detail) {
  RankReport r{.jobId = record.jobId, .attempt = record.attempt, .rank = record.rank, .event = event,
               .pid = record.pid, .exitCode = 0, .signal = 0, .detail = detail, .step = 0, .metrics = {},
               .timeMs = clock_->nowMs()};
  if (event == RankEvent::kExited) {
    r.exitCode = record.lastReport.exitCode;
    r.signal = record.lastReport.signal;
  }
  record.lastReport = r;
  persist(record);
  link_->sendRankReport(r);
  counters_.reportsRelayed += 1;
  if (event == RankEvent::kStarted) counters_.launches += 1;
  if (event == RankEvent::kLaunchFailed) counters_.exits["launch_failed"] += 1;
}

void Daemon::onLaunch(LaunchOrder order) {
  loop_->post([this, order = std::move(order)]() mutable {
    const std::string dir = attemptDir(order.jobId, order.attempt);
    Status prepared = files::makeDirs(dir);
    if (prepared.isOk()) prepared = files::writeFileAtomic(dir + "/spec.json", order.specJson);
    if (prepared.isOk() && !order.plan.empty()) prepared = files::writeFileAtomic(dir + "/plan.pb", order.plan);
    if (order.pickMasterPort && prepared.isOk()) {
      auto port = pickFreePort();
      if (port.isOk()) {
        order.masterPort = *port;
        if (order.masterAddr.empty()) order.masterAddr = options_.address.empty() ? "127.0.0.1" : options_.address;
        link_->sendMasterEndpoint({.jobId = order.jobId, .attempt = order.attempt, .address = order.masterAddr,
                                   .port = order.masterPort});
      } else {
        prepared = port.status();
      }
    }
    std::vector<int> gpus;
    if (prepared.isOk()) {
      auto assigned = assignGpus(order);
      if (assigned.isOk()) {
        gpus = std::move(assigned).value();
      } else {
        prepared = assigned.status();
      }
    }
    const std::string visible = visibleDevices(gpus);
    for (const auto& assignment : order.ranks) {
      if (!prepared.isOk()) {
        RankRecord r{.jobId = order.jobId, .attempt = order.attempt, .rank = assignment.rank,
                     .localRank = assignment.localRank};
        r.exited = true;
        auto& stored = ranks_[r.key()] = r;
        report(stored, RankEvent::kLaunchFailed, prepared.toString());
        continue;
      }
      const int gpu = gpus.empty() ? -1 : gpus.at(static_cast<size_t>(assignment.localRank));
      launchRank(order, assignment, dir, gpu, visible);
    }
  });
}

StatusOr<std::vector<int>> Daemon::assignGpus(const LaunchOrder& order) const {
  if (options_.gpus.empty()) return std::vector<int>{};
  auto spec = nlohmann::json::parse(order.specJson, nullptr, /*allow_exceptions=*/false);
  const bool cuda = spec.is_object() && spec.value("resources", nlohmann::json::object()).value("device", "") == "cuda";
  if (!cuda) return std::vector<int>{};
  std::vector<int> held;
  for (const auto& [key, r] : ranks_) {
    if (!r.exited && r.gpu >= 0) held.push_back(r.gpu);
  }
  const size_t needed = order.ranks.size();
  std::vector<int> free = freeGpus(options_.gpus, held);
  if (free.size() < needed)
    return failedPrecondition("node {}: {} free GPU{} for {} rank{} of a cuda job (loomd --gpus)", options_.nodeId,
                              free.size(), free.size() == 1 ? "" : "s", needed, needed == 1 ? "" : "s");
  free.resize(needed);
  return free;
}

void Daemon::launchRank(const LaunchOrder& order, const RankAssignment& assignment, const std::string& dir, int gpu,
                        const std::string& visibleGpus) {
  RankRecord r{.jobId = order.jobId, .attempt = order.attempt, .rank = assignment.rank,
               .localRank = assignment.localRank};
  r.gpu = gpu;
  r.logPath = LogServer::logPath(options_.stateDir + "/jobs", order.jobId, order.attempt, assignment.rank);
  r.rankDir = fmt::format("{}/rank-{}", dir, assignment.rank);
  r.heartbeatTimeoutMs = order.heartbeatTimeoutMs;
  r.lastHeartbeatMs = clock_->steadyMs();
  if (ranks_.count(r.key())) return;  // a repeated order: the rank is already there

  const int64_t heartbeatMs = std::clamp<int64_t>(order.heartbeatTimeoutMs / 4, 50, 5000);
  process::SpawnOptions spawn{
      .executable = options_.workerPath,
      .args = {},
      .env = {{"LOOM_JOB_ID", order.jobId},
              {"LOOM_ATTEMPT", std::to_string(order.attempt)},
              {"LOOM_NODE_ID", options_.nodeId},
              {"LOOM_SPEC", dir + "/spec.json"},
              {"LOOM_PLAN", order.plan.empty() ? std::string() : dir + "/plan.pb"},
              {"LOOM_RANK_DIR", r.rankDir},
              {"LOOM_REPORT_SOCKET", reports_->path()},
              {"LOOM_HEARTBEAT_MS", std::to_string(heartbeatMs)},
              {"RANK", std::to_string(assignment.rank)},
              {"LOCAL_RANK", std::to_string(assignment.localRank)},
              {"WORLD_SIZE", std::to_string(order.worldSize)},
              {"LOCAL_WORLD_SIZE", std::to_string(order.localWorldSize)},
              {"GROUP_RANK", std::to_string(order.groupRank)},
              {"MASTER_ADDR", order.masterAddr},
              {"MASTER_PORT", std::to_string(order.masterPort)},
              {"TORCHELASTIC_RESTART_COUNT", std::to_string(order.attempt - 1)}},
      .logPath = r.logPath,
      .workingDir = "",
      .newSession = true,
  };
  if (!order.serviceToken.empty()) spawn.env["LOOM_SERVICE_TOKEN"] = order.serviceToken;
  if (!visibleGpus.empty()) {
    // The attempt's GPUs on this node, local rank i's at index i; PCI bus order, as the indices
    // of --gpus and of /proc/driver/nvidia/gpus are.
    spawn.env["CUDA_VISIBLE_DEVICES"] = visibleGpus;
    spawn.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  }
  if (!options_.kernelDirs.empty()) {
    std::string dirs;
    for (const std::string& dir : options_.kernelDirs) dirs += (dirs.empty() ? "" : ":") + dir;
    spawn.env["LOOM_KERNEL_DIRS"] = dirs;
  }
  Status made = files::makeDirs(r.rankDir);
  if (options_.runAs) {
    spawn.runAs = options_.runAs;
    spawn.env["USER"] = spawn.env["LOGNAME"] = options_.runAs->name;
    spawn.env["HOME"] = options_.runAs->home;
    if (made.isOk() && ::chown(r.rankDir.c_str(), options_.runAs->uid, options_.runAs->gid) != 0)
      made = errnoStatus("chown " + r.rankDir + " to " + options_.runAs->name);
  }
  if (made.isOk() && !order.serviceCertificate.certificate.empty() && assignment.rank == 0) {
    made = writeServiceCertificate(r.rankDir, order.serviceCertificate, options_.runAs);
    spawn.env["LOOM_SERVICE_CERT"] = r.rankDir + "/service.crt";
    spawn.env["LOOM_SERVICE_KEY"] = r.rankDir + "/service.key";
  }
  auto pid = made.isOk() ? process::spawn(spawn) : StatusOr<int>(made);
  if (!pid.isOk()) {
    r.exited = true;
    auto& stored = ranks_[r.key()] = r;
    spdlog::error("job {} rank {}: launch failed: {}", order.jobId, assignment.rank, pid.status().toString());
    report(stored, RankEvent::kLaunchFailed, "launch failed: " + pid.status().message());
    return;
  }
  r.pid = *pid;
  r.startTime = process::startTime(r.pid);
  auto& stored = ranks_[r.key()] = r;
  spdlog::info("job {} attempt {}: rank {} started (pid {}, log {})", order.jobId, order.attempt, r.rank, r.pid,
               r.logPath);
  report(stored, RankEvent::kStarted);
}

void Daemon::onWorkerMessage(const WorkerMessage& m) {
  auto it = ranks_.find(RankRecord{.jobId = m.jobId, .attempt = m.attempt, .rank = m.rank}.key());
  if (it == ranks_.end() || it->second.exited || it->second.pid != m.pid) return;
  RankRecord& r = it->second;
  r.lastHeartbeatMs = clock_->steadyMs();
  const bool ready = r.lastReport.event == RankEvent::kReady;
  if ((m.type == WorkerMessage::Type::kReady || m.type == WorkerMessage::Type::kProgress) && !ready)
    report(r, RankEvent::kReady, m.detail);
  if (m.type == WorkerMessage::Type::kFailing) r.failure = m.detail;
  if (!m.serviceAddress.empty() && m.serviceAddress != r.lastReport.serviceAddress) {
    // A served rollout now listens: the planner routes its clients there.
    r.lastReport.serviceAddress = m.serviceAddress;
    persist(r);
    link_->sendRankReport(r.lastReport);
  }
  if (m.type == WorkerMessage::Type::kProgress) {
    r.step = std::max(r.step, m.step);
    counters_.reportsRelayed += 1;
    // Progress is passed on, not persisted: the record keeps the lifecycle report.
    link_->sendRankReport(RankReport{.jobId = r.jobId, .attempt = r.attempt, .rank = r.rank,
                                     .event = RankEvent::kProgress, .pid = r.pid, .exitCode = 0, .signal = 0,
                                     .detail = m.detail, .step = m.step, .metrics = m.metrics,
                                     .timeMs = clock_->nowMs()});
  }
}

void Daemon::markExited(RankRecord& r, int exitCode, int signal, const std::string& detail) {
  r.exited = true;
  r.lastReport.exitCode = exitCode;
  r.lastReport.signal = signal;
  process::ExitInfo exit{.exitCode = exitCode, .signal = signal};
  spdlog::info("job {} attempt {}: rank {} (pid {}) ended: {}", r.jobId, r.attempt, r.rank, r.pid,
               process::describeExit(exit));
  counters_.exits[exitCode == 0 && signal == 0 ? "succeeded" : process::isPreemption(exit) ? "preempted" : "failed"] +=
      1;
  report(r, RankEvent::kExited, detail);
}

void Daemon::reportReaped(const std::string& key) {
  auto it = ranks_.find(key);
  if (it == ranks_.end() || it->second.exited || !it->second.reapedStatus) return;
  RankRecord& r = it->second;
  auto exit = process::decodeWaitStatus(*r.reapedStatus);
  markExited(r, exit.exitCode, exit.signal, r.heartbeatLost ? r.lastReport.detail : r.failure);
}

void Daemon::tick() {
  for (;;) {
    // Peek first (WNOWAIT): while the rank is an unreaped zombie its pid, and so its process
    // group, cannot be reused, and whatever it left running in the group is stopped with it.
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) break;
    const pid_t pid = info.si_pid;
    process::signalGroup(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    for (auto& [key, r] : ranks_) {
      if (r.child && r.pid == pid && !r.exited && !r.reapedStatus) {
        // Reported once the datagrams the rank sent before it exited (its last progress, why it
        // failed) have been handled: they are on the socket already, ahead of this.
        r.reapedStatus = status;
        reports_->afterQueued([this, key = key] { loop_->post([this, key] { reportReaped(key); }); });
        break;
      }
    }
  }
  const int64_t now = clock_->steadyMs();
  for (auto& [key, r] : ranks_) {
    if (r.exited || r.reapedStatus) continue;
    if (!r.child && !process::isAlive(r.pid, r.startTime)) {
      auto code = readExitStatus(r.rankDir);
      markExited(r, code.value_or(255), 0, code ? "" : "exit status unknown (re-adopted rank)");
      continue;
    }
    if (r.killDeadlineMs != 0 && now >= r.killDeadlineMs) {
      spdlog::warn("job {} rank {} (pid {}) outlived its grace period: SIGKILL", r.jobId, r.rank, r.pid);
      process::signalGroup(r.pid, SIGKILL);
      r.killDeadlineMs = 0;
    }
    if (!r.heartbeatLost && !r.stopping && r.heartbeatTimeoutMs > 0 &&
        now - r.lastHeartbeatMs > r.heartbeatTimeoutMs) {
      r.heartbeatLost = true;
      std::string detail = fmt::format("no heartbeat for {:.1f} s (timeout {:.1f} s); killed",
                                       (now - r.lastHeartbeatMs) / 1000.0, r.heartbeatTimeoutMs / 1000.0);
      spdlog::warn("job {} rank {} (pid {}): {}", r.jobId, r.rank, r.pid, detail);
      process::signalGroup(r.pid, SIGKILL);
      report(r, RankEvent::kHeartbeatLost, detail);
    }
  }
}

void Daemon::onKill(KillOrder order) {
  loop_->post([this, order = std::move(order)] {
    const int64_t now = clock_->steadyMs();
    for (auto& [key, r] : ranks_) {
      if (r.jobId != order.jobId || r.attempt != order.attempt || r.exited) continue;
      r.stopping = true;
      if (r.reapedStatus) continue;  // gone already: its pid may be another process's by now
      if (order.gracePeriodMs <= 0) {
        process::signalGroup(r.pid, SIGKILL);
      } else if (r.killDeadlineMs == 0 && !r.heartbeatLost) {
        askToStop(r, order.preempt ? SIGTERM : SIGINT, order.reason);
        r.killDeadlineMs = now + order.gracePeriodMs;
      }
    }
  });
}

void Daemon::onRelease(ReleaseOrder order) {
  loop_->post([this, order = std::move(order)] {
    for (auto it = ranks_.begin(); it != ranks_.end();) {
      const RankRecord& r = it->second;
      if (r.jobId == order.jobId && r.attempt == order.attempt && r.exited) {
        ::unlink(recordPath(r).c_str());
        it = ranks_.erase(it);
      } else {
        ++it;
      }
    }
  });
}

void Daemon::onLogRequest(LogQuery query) { logs_->serve(query); }

void Daemon::onLogCancel(int64_t requestId) { logs_->cancel(requestId); }

void Daemon::onDisconnected() {
  loop_->post([this] { counters_.plannerConnected = false; });
  if (logs_) logs_->cancelAll();
}

}  // namespace loom::daemon
