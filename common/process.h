#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::process {

// An unprivileged user a child runs as (loomd --run-as).
struct RunAs {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // its supplementary groups
  std::string home;
};
// The user's ids and groups from the system's user database; NotFound naming it.
StatusOr<RunAs> lookupUser(const std::string& name);

struct SpawnOptions {
  std::string executable;
  std::vector<std::string> args;              // argv[1..]
  std::map<std::string, std::string> env;     // added to (and overriding) this process's env
  std::string logPath;                        // stdout and stderr appended here; empty: inherit
  std::string workingDir;                     // empty: inherit
  bool newSession = true;                     // own session and process group (setsid)
  std::optional<RunAs> runAs;                 // drop to this user before exec (the log is opened first)
};

// Starts a child process. It is the leader of its own process group, so a signal to -pid
// reaches everything it started too.
StatusOr<int> spawn(const SpawnOptions& options);

// The process's start time in clock ticks since boot (/proc/PID/stat field 22), or 0 if it does
// not exist. A pid plus its start time names a process without the risk of pid reuse.
uint64_t startTime(int pid);
// True if `pid` exists, is not a zombie and (when startTime != 0) started at that time.
bool isAlive(int pid, uint64_t startTime = 0);
// Sends `sig` to the process group of `pid` (which spawn() made a group leader).
void signalGroup(int pid, int sig);

// How a child ended, from waitpid's status.
struct ExitInfo {
  int exitCode = 0;  // valid when signal == 0
  int signal = 0;
};
ExitInfo decodeWaitStatus(int status);
std::string describeExit(const ExitInfo& exit);  // "exit code 3", "killed by SIGKILL"

// A rank's exit status after SIGTERM when it stopped on its own: a train rank writes a checkpoint
// first. 75 is sysexits' EX_TEMPFAIL: the work is not done, and may be tried again.
constexpr int kExitPreempted = 75;
// A rank that was preempted: it exited kExitPreempted, or SIGTERM ended it (a job kind that has
// nothing to save keeps SIGTERM's default action).
bool isPreemption(const ExitInfo& exit);

// Pids of live processes whose environment has NAME=VALUE (for finding a job's processes).
std::vector<int> findByEnv(const std::string& name, const std::string& value);

// The most resident memory this process has held (VmHWM), in bytes; 0 where /proc is not there.
int64_t peakResidentBytes();

// What a live process holds and has used, from /proc: resident bytes now (statm), the most it
// has held (status's VmHWM) and CPU seconds in user and kernel mode (stat's utime + stime).
struct Usage {
  int64_t residentBytes = 0;
  int64_t peakResidentBytes = 0;
  double cpuSeconds = 0;
};
// nullopt when the process is gone (or /proc is not there).
std::optional<Usage> usage(int pid);

}  // namespace loom::process
