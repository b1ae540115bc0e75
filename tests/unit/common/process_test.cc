#include "common/process.h"

#include <csignal>

#include <sys/wait.h>
#include <unistd.h>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;

namespace {

process::ExitInfo waitFor(int pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return process::decodeWaitStatus(status);
}

}  // namespace

TEST_CASE("spawn: environment - log file and exit code", "[common]") {
  testing::TempDir dir;
  std::string log = dir.path() + "/out.log";
  auto pid = process::spawn({.executable = "/bin/sh", .args = {"-c", "echo \"$LOOM_X\"; echo err >&2; exit 3"},
                             .env = {{"LOOM_X", "hello"}}, .logPath = log, .workingDir = "", .newSession = true});
  REQUIRE(pid.isOk());
  auto exit = waitFor(*pid);
  CHECK(exit.exitCode == 3);
  CHECK(process::describeExit(exit) == "exit code 3");
  CHECK(files::readFile(log).value() == "hello\nerr\n");
}

TEST_CASE("spawn: a missing executable is an error - not a process exiting 127", "[common]") {
  auto pid = process::spawn({.executable = "/no/such/binary", .args = {}, .env = {}, .logPath = "", .workingDir = "",
                             .newSession = true});
  REQUIRE_FALSE(pid.isOk());
  CHECK(pid.status().message().find("/no/such/binary") != std::string::npos);
}

TEST_CASE("a spawned process leads its own group: one signal stops everything it started", "[common]") {
  auto pid = process::spawn({.executable = "/bin/sh", .args = {"-c", "sleep 100 & sleep 100"}, .env = {},
                             .logPath = "", .workingDir = "", .newSession = true});
  REQUIRE(pid.isOk());
  CHECK(::getpgid(*pid) == *pid);
  uint64_t start = process::startTime(*pid);
  CHECK(start > 0);
  CHECK(process::isAlive(*pid, start));
  CHECK_FALSE(process::isAlive(*pid, start + 1));  // same pid, another process
  process::signalGroup(*pid, SIGKILL);
  auto exit = waitFor(*pid);
  CHECK(exit.signal == SIGKILL);
  CHECK(process::describeExit(exit) == "killed by SIGKILL");
  CHECK_FALSE(process::isAlive(*pid));
}

TEST_CASE("a process's usage: resident bytes, the most it held and CPU seconds; none once it is gone", "[common]") {
  // Some CPU time of this process's own, so that the count has something to show.
  volatile double sink = 0;
  for (int i = 0; i < 20'000'000; ++i) sink = sink + i * 0.5;
  auto self = process::usage(::getpid());
  REQUIRE(self.has_value());
  CHECK(self->residentBytes > 0);
  CHECK(self->peakResidentBytes >= self->residentBytes);
  CHECK(process::peakResidentBytes() >= self->peakResidentBytes);
  CHECK(self->cpuSeconds > 0);

  const int pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  CHECK_FALSE(process::usage(pid).has_value());
}
