#include "tests/integration/cluster.h"

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "common/files.h"
#include "common/process.h"
#include "common/security/tokens.h"
#include "tests/catch.h"

namespace loom::testing {

std::string binary(const std::string& name) { return std::string(LOOM_BIN_DIR) + "/" + name; }

Child::Child(const std::string& binaryPath, std::vector<std::string> args, const std::string& logPath) {
  auto pid = process::spawn({.executable = binaryPath, .args = std::move(args), .env = {}, .logPath = logPath,
                             .workingDir = "", .newSession = true});
  if (!pid.isOk()) throw std::runtime_error(pid.status().toString());
  pid_ = *pid;
}

Child::~Child() {
  if (pid_ > 0) terminate();
}

void Child::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

void Child::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int Child::terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  kill();
  return -1;
}

const TestCredentials& testCredentials() {
  static const TestCredentials credentials = [] {
    static TempDir dir;
    TestCredentials c{.tokensFile = dir.path() + "/tokens",
                      .adminTokenFile = dir.path() + "/admin.token",
                      .nodeTokenFile = dir.path() + "/node.token",
                      .admin = {}};
    std::string lines;
    for (auto [path, role] : {std::pair{c.adminTokenFile, security::Role::kAdmin},
                              std::pair{c.nodeTokenFile, security::Role::kNode}}) {
      auto token = security::generateToken();
      if (!token.isOk()) throw std::runtime_error(token.status().toString());
      if (!files::writeFileAtomic(path, *token + "\n", 0600).isOk()) throw std::runtime_error("cannot write " + path);
      lines += security::tokensFileLine(
          {.hash = security::tokenHash(*token),
           .identity = {.user = role == security::Role::kNode ? "*" : "test-admin", .role = role}});
      if (role == security::Role::kAdmin) c.admin.token = *token;
    }
    if (!files::writeFileAtomic(c.tokensFile, lines, 0600).isOk()) throw std::runtime_error("cannot write tokens");
    return c;
  }();
  return credentials;
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

static std::string awaitAddressFile(const std::string& path) {
  std::string address;
  bool found = eventually(
      [&] {
        auto text = files::readFile(path);
        if (!text.isOk() || text->empty()) return false;
        address = text->substr(0, text->find('\n'));
        return true;
      },
      std::chrono::seconds(20));
  if (!found) throw std::runtime_error("no address file at " + path);
  return address;
}

Standalone::Standalone(int slots, double nodeTimeoutS) {
  ::unlink((dir.path() + "/planner.address").c_str());
  loomd = std::make_unique<Child>(binary("loomd"),
                                  std::vector<std::string>{"--standalone", "--listen", "127.0.0.1:0", "--state-dir",
                                                           dir.path(), "--slots", std::to_string(slots), "--node-id",
                                                           "node-a", "--node-timeout", std::to_string(nodeTimeoutS),
                                                           "--tokens", testCredentials().tokensFile},
                                  dir.path() + "/loomd.log");
  address = awaitAddressFile(dir.path() + "/planner.address");
  client = std::make_unique<client::LoomClient>(address, testCredentials().admin);
  REQUIRE(client->awaitReady(std::chrono::seconds(10)).isOk());
}

PlannerProcess::PlannerProcess(const std::string& listen, const std::string& stateDirIn, double nodeTimeoutS) {
  stateDir_ = stateDirIn.empty() ? dir.path() : stateDirIn;
  ::unlink((stateDir_ + "/planner.address").c_str());
  process = std::make_unique<Child>(binary("loom-planner"),
                                    std::vector<std::string>{"--listen", listen, "--state-dir", stateDir_,
                                                             "--node-timeout", std::to_string(nodeTimeoutS), "--tokens",
                                                             testCredentials().tokensFile},
                                    stateDir_ + "/planner.log");
  address = awaitAddressFile(stateDir_ + "/planner.address");
}

DaemonProcess::DaemonProcess(const std::string& plannerAddress, int slots, const std::string& id,
                             const std::string& stateDirIn, const std::vector<std::string>& extraArgs)
    : nodeId(id) {
  stateDir_ = stateDirIn.empty() ? dir.path() : stateDirIn;
  std::vector<std::string> args{"--planner", plannerAddress, "--state-dir", stateDir_,
                                "--slots",   std::to_string(slots), "--node-id", nodeId,
                                "--token-file", testCredentials().nodeTokenFile};
  args.insert(args.end(), extraArgs.begin(), extraArgs.end());
  process = std::make_unique<Child>(binary("loomd"), args, stateDir_ + "/loomd.log");
}

std::string probeSpec(int ranks, int ticks, int tickMs, const nlohmann::json& patch) {
  nlohmann::json spec{{"name", "probe"},
                      {"kind", "probe"},
                      {"resources", {{"ranks", ranks}, {"device", "cpu"}}},
                      {"probe", {{"ticks", ticks}, {"tick_ms", tickMs}}},
                      {"restart", {{"max_restarts", 0}}},
                      {"timeouts", {{"grace_period_s", 2}, {"heartbeat_timeout_s", 10}}}};
  spec.merge_patch(patch);
  return spec.dump();
}

v1::Job awaitRunning(client::LoomClient& client, const std::string& jobId, std::chrono::milliseconds timeout) {
  v1::Job job;
  Status s = client.watchJob(
      jobId,
      [&](const v1::JobUpdate& update) {
        job = update.job();
        if (job.state() != v1::RUNNING) return true;
        for (const auto& r : job.ranks()) {
          if (r.pid() <= 0) return true;
        }
        return false;
      },
      timeout);
  INFO("job " << jobId << " is " << client::stateName(job.state()) << ": " << job.reason());
  REQUIRE(job.state() == v1::RUNNING);
  return job;
}

v1::Job awaitFinal(client::LoomClient& client, const std::string& jobId, std::chrono::milliseconds timeout) {
  auto job = client.awaitJob(jobId, timeout);
  INFO(job.status().toString());
  REQUIRE(job.isOk());
  return *job;
}

std::vector<int> jobProcesses(const std::string& jobId) { return process::findByEnv("LOOM_JOB_ID", jobId); }

}  // namespace loom::testing
