// The communicator conformance suite as real processes: 2, 3 and 4 ranks of comm_rank on UCX,
// rendezvous through rank 0's store on a free port.
#include <csignal>
#include <thread>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/files.h"
#include "common/process.h"
#include "tests/catch.h"
#include "tests/free_port.h"
#include "tests/temp_dir.h"

using namespace loom;
using loom::testing::freePort;

namespace {


struct RankResult {
  int exitCode = -1;
  std::string log;
};

// Starts ranks 0..launched-1 of a world of `world` and waits for them.
std::vector<RankResult> runRanks(int world, int launched, const std::string& mode) {
  testing::TempDir dir;
  const std::string port = std::to_string(freePort());
  std::vector<int> pids;
  for (int r = 0; r < launched; ++r) {
    auto pid = process::spawn({.executable = std::string(LOOM_BIN_DIR) + "/loom-comm-conformance-rank",
                               .args = {},
                               .env = {{"RANK", std::to_string(r)},
                                       {"WORLD_SIZE", std::to_string(world)},
                                       {"MASTER_ADDR", "127.0.0.1"},
                                       {"MASTER_PORT", port},
                                       {"LOOM_CONFORMANCE_MODE", mode}},
                               .logPath = dir.path() + "/rank" + std::to_string(r) + ".log",
                               .workingDir = "",
                               .newSession = true});
    REQUIRE(pid.isOk());
    pids.push_back(*pid);
  }
  std::vector<RankResult> results(launched);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  for (int r = 0; r < launched; ++r) {
    int status = 0;
    while (::waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (int p : pids) process::signalGroup(p, SIGKILL);
        ::waitpid(pids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    results[r].exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    results[r].log = files::readFile(dir.path() + "/rank" + std::to_string(r) + ".log").value();
  }
  return results;
}

// Runs every rank of a world of `world` in `mode`; each must exit 0 (its own checks passed).
void expectEveryRankPasses(int world, const std::string& mode) {
  auto results = runRanks(world, world, mode);
  for (int r = 0; r < world; ++r) {
    INFO("mode '" << mode << "', world " << world << " rank " << r << ":\n" << results[r].log);
    CHECK(results[r].exitCode == 0);
  }
}

}  // namespace

TEST_CASE("every collective - every dtype - uneven sizes - sub-groups on 2 3 and 4 ranks", "[conformance]") {
  for (int world : {2, 3, 4}) expectEveryRankPasses(world, "");
}

TEST_CASE("a silent peer fails the others' collective within the timeout - naming the op", "[conformance]") {
  expectEveryRankPasses(3, "peer-stops");
}

TEST_CASE("allocated tensors: a silent peer fails the others within the timeout - one that exits at once", "[conformance]") {
  for (const char* mode : {"shared-peer-stops", "shared-peer-exits"}) expectEveryRankPasses(3, mode);
}

TEST_CASE("allocated tensors: different sizes fail on every rank naming them - a call one rank refuses pairs with none", "[conformance]") {
  for (const char* mode : {"shared-size-mismatch", "shared-refused-call"}) expectEveryRankPasses(2, mode);
}

TEST_CASE("a rank that never joins fails rendezvous - naming it", "[conformance]") {
  auto results = runRanks(3, 2, "missing-rank");
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << results[r].log);
    CHECK(results[r].exitCode == 0);
    CHECK(results[r].log.find("rank 2 did not join") != std::string::npos);
  }
}

TEST_CASE("ranks that disagree about a tensor's size get an error naming the sizes", "[conformance]") {
  expectEveryRankPasses(2, "size-mismatch");
}
