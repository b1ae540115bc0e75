#include "common/process.h"

#include <cstdio>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace loom::process {

StatusOr<RunAs> lookupUser(const std::string& name) {
  std::vector<char> buffer(16384);
  struct passwd entry {};
  struct passwd* found = nullptr;
  const int rc = ::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (rc != 0 || !found) return notFound("user {} is not in this machine's user database", name);
  RunAs user{.name = name, .uid = found->pw_uid, .gid = found->pw_gid, .groups = {}, .home = found->pw_dir};
  int count = 64;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  if (::getgrouplist(name.c_str(), found->pw_gid, groups.data(), &count) < 0) {
    groups.resize(static_cast<size_t>(count));
    ::getgrouplist(name.c_str(), found->pw_gid, groups.data(), &count);
  }
  groups.resize(static_cast<size_t>(count));
  user.groups = std::move(groups);
  return user;
}

StatusOr<int> spawn(const SpawnOptions& options) {
  // Everything the child needs is prepared before fork: after fork only async-signal-safe calls.
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [k, v] : options.env) env[k] = v;
  std::vector<std::string> envStrings;
  envStrings.reserve(env.size());
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : envStrings) envp.push_back(s.data());
  envp.push_back(nullptr);

  std::vector<std::string> argStrings;
  argStrings.push_back(options.executable);
  argStrings.insert(argStrings.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (auto& s : argStrings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int logFd = -1;
  if (!options.logPath.empty()) {
    logFd = ::open(options.logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logFd < 0) return errnoStatus("cannot open log file " + options.logPath);
  }
  // The child reports a failed exec through this pipe, so the caller gets the reason instead
  // of a process that exits 127.
  int errPipe[2];
  if (::pipe2(errPipe, O_CLOEXEC) != 0) {
    if (logFd >= 0) ::close(logFd);
    return errnoStatus("pipe");
  }

  pid_t pid = ::fork();
  if (pid < 0) {
    Status s = errnoStatus("fork");
    if (logFd >= 0) ::close(logFd);
    ::close(errPipe[0]);
    ::close(errPipe[1]);
    return s;
  }
  if (pid == 0) {
    if (options.newSession) ::setsid();
    // Start with default signal dispositions and an empty mask, whatever the parent had.
    sigset_t all;
    sigemptyset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
    if (logFd >= 0) {
      ::dup2(logFd, STDOUT_FILENO);
      ::dup2(logFd, STDERR_FILENO);
    }
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    if (!options.workingDir.empty() && ::chdir(options.workingDir.c_str()) != 0) {
      int err = errno;
      (void)!::write(errPipe[1], &err, sizeof err);
      ::_exit(127);
    }
    // Groups, then the group, then the user: once the user changes, the rest cannot.
    if (options.runAs &&
        (::setgroups(options.runAs->groups.size(), options.runAs->groups.data()) != 0 ||
         ::setgid(options.runAs->gid) != 0 || ::setuid(options.runAs->uid) != 0)) {
      int err = errno;
      (void)!::write(errPipe[1], &err, sizeof err);
      ::_exit(127);
    }
    ::execve(argv[0], argv.data(), envp.data());
    int err = errno;
    (void)!::write(errPipe[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(errPipe[1]);
  if (logFd >= 0) ::close(logFd);
  int childErr = 0;
  ssize_t n;
  do {
    n = ::read(errPipe[0], &childErr, sizeof childErr);
  } while (n < 0 && errno == EINTR);
  ::close(errPipe[0]);
  if (n == sizeof childErr) {
    ::waitpid(pid, nullptr, 0);
    return internalError("cannot execute {}: {}", options.executable, std::strerror(childErr));
  }
  return static_cast<int>(pid);
}

uint64_t startTime(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  // Field 3 (state) is the first after ')'; start time is field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return 0;
  }
  return std::stoull(field);
}

static char processState(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

bool isAlive(int pid, uint64_t expectedStart) {
  if (pid <= 0) return false;
  char state = processState(pid);
  if (state == 0 || state == 'Z' || state == 'X') return false;
  return expectedStart == 0 || startTime(pid) == expectedStart;
}

void signalGroup(int pid, int sig) {
  // Only the group: a rank leads its own, so a bare-pid fallback could only reach a stranger
  // that reused the pid.
  if (pid > 0) ::kill(-pid, sig);
}

ExitInfo decodeWaitStatus(int status) {
  ExitInfo info;
  if (WIFEXITED(status)) info.exitCode = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) info.signal = WTERMSIG(status);
  return info;
}

bool isPreemption(const ExitInfo& exit) {
  return exit.signal == SIGTERM || (exit.signal == 0 && exit.exitCode == kExitPreempted);
}

std::string describeExit(const ExitInfo& exit) {
  if (exit.signal == 0 && exit.exitCode == kExitPreempted) return "preempted: stopped after SIGTERM";
  if (exit.signal != 0) {
    const char* abbrev = sigabbrev_np(exit.signal);
    return std::string("killed by ") + (abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(exit.signal));
  }
  return "exit code " + std::to_string(exit.exitCode);
}

std::vector<int> findByEnv(const std::string& name, const std::string& value) {
  std::vector<int> pids;
  std::string needle = name + "=" + value;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    std::string dir = entry.path().filename().string();
    if (dir.empty() || !std::isdigit(static_cast<unsigned char>(dir[0]))) continue;
    int pid = std::atoi(dir.c_str());
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    if (!in) continue;
    std::string var;
    while (std::getline(in, var, '\0')) {
      if (var == needle) {
        if (isAlive(pid)) pids.push_back(pid);
        break;
      }
    }
  }
  return pids;
}

int64_t peakResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}

std::optional<Usage> usage(int pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  Usage out;
  std::ifstream statm(proc + "/statm");
  long long pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return std::nullopt;
  out.residentBytes = static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE);
  std::ifstream stat(proc + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // The fields after the command name, which may hold spaces and ends at the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; fields >> field && i <= 15; ++i)  // field 3 is the state; 14 utime, 15 stime
    if (i >= 14) ticks += std::stod(field);
  out.cpuSeconds = ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::ifstream status(proc + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) out.peakResidentBytes = std::stoll(line.substr(6)) * 1024;
  return out;
}

}  // namespace loom::process
