#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/loom_client.h"
#include "tests/temp_dir.h"

namespace loom::testing {

// A child process (a Loom binary) stopped when the test ends: SIGTERM, then SIGKILL.
class Child {
 public:
  Child(const std::string& binary, std::vector<std::string> args, const std::string& logPath);
  ~Child();
  int pid() const { return pid_; }
  void signal(int sig);
  // Kills the process and waits for it.
  void kill();
  // Sends SIGTERM and waits for a clean exit.
  int terminate();

 private:
  int pid_ = -1;
};

std::string binary(const std::string& name);  // build/bin/<name>

// Polls `condition` until it holds or `timeout` passes. For conditions on processes (which
// publish no event to wait on), not for time.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// The credentials every process of a test binary uses, as an operator would set them up: a
// tokens file (the planners' --tokens) holding an admin's token and a node token, each also in
// a file of its own (loomctl's and loomd's --token-file). Made once per process.
struct TestCredentials {
  std::string tokensFile;
  std::string adminTokenFile;
  std::string nodeTokenFile;
  security::ClientCredentials admin;  // what a test's LoomClient connects with
};
const TestCredentials& testCredentials();

// Loom processes on loopback with port 0 and temp state dirs, all with testCredentials().
struct Standalone {
  TempDir dir;
  std::unique_ptr<Child> loomd;
  std::string address;
  std::unique_ptr<client::LoomClient> client;

  explicit Standalone(int slots, double nodeTimeoutS = 15);
};

struct PlannerProcess {
  TempDir dir;
  std::unique_ptr<Child> process;
  std::string address;

  // listen: "127.0.0.1:0", or the address of an earlier run to come back on.
  explicit PlannerProcess(const std::string& listen = "127.0.0.1:0", const std::string& stateDir = "",
                          double nodeTimeoutS = 15);
  std::string stateDir() const { return stateDir_; }

 private:
  std::string stateDir_;
};

struct DaemonProcess {
  TempDir dir;
  std::unique_ptr<Child> process;
  std::string nodeId;

  DaemonProcess(const std::string& plannerAddress, int slots, const std::string& nodeId,
                const std::string& stateDir = "", const std::vector<std::string>& extraArgs = {});
  std::string stateDir() const { return stateDir_; }

 private:
  std::string stateDir_;
};

// A probe job spec; `patch` is merged over the defaults.
std::string probeSpec(int ranks, int ticks, int tickMs, const nlohmann::json& patch = nlohmann::json::object());

// Waits until the job is RUNNING with every rank's pid known, and returns it.
v1::Job awaitRunning(client::LoomClient& client, const std::string& jobId,
                     std::chrono::milliseconds timeout = std::chrono::seconds(30));
v1::Job awaitFinal(client::LoomClient& client, const std::string& jobId,
                   std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Live processes started for this job (by the LOOM_JOB_ID in their environment).
std::vector<int> jobProcesses(const std::string& jobId);

}  // namespace loom::testing
