#include "daemon/log_server.h"

#include <condition_variable>
#include <mutex>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/temp_dir.h"

using namespace loom;
using loom::daemon::LogServer;

namespace {

// Collects what a LogServer sends, until `done`.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::string> byRank;
  bool done = false;

  LogServer::Sender sender() {
    return [this](const LogData& d) {
      std::lock_guard lock(mu);
      if (d.done) done = true;
      byRank[d.rank] += d.data;
      cv.notify_all();
    };
  }
  bool awaitDone() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; });
  }
};

}  // namespace

TEST_CASE("the last N lines of every rank - or of the ranks asked for", "[daemon]") {
  testing::TempDir dir;
  REQUIRE(files::makeDirs(dir.path() + "/j/attempt-1").isOk());
  REQUIRE(files::writeFileAtomic(LogServer::logPath(dir.path(), "j", 1, 0), "a\nb\nc\n").isOk());
  REQUIRE(files::writeFileAtomic(LogServer::logPath(dir.path(), "j", 1, 1), "x\ny").isOk());
  {
    Collector c;
    LogServer server(dir.path(), [](const std::string&, int, int) { return false; }, c.sender());
    server.serve({.requestId = 1, .jobId = "j", .attempt = 1, .ranks = {}, .tailLines = 2, .follow = false});
    REQUIRE(c.awaitDone());
    CHECK(c.byRank[0] == "b\nc\n");
    CHECK(c.byRank[1] == "x\ny");
  }
  {
    Collector c;
    LogServer server(dir.path(), [](const std::string&, int, int) { return false; }, c.sender());
    server.serve({.requestId = 2, .jobId = "j", .attempt = 1, .ranks = {0}, .tailLines = 0, .follow = false});
    REQUIRE(c.awaitDone());
    CHECK(c.byRank.size() == 1);
    CHECK(c.byRank[0] == "a\nb\nc\n");
  }
}

TEST_CASE("following picks up appended output until the rank ends", "[daemon]") {
  testing::TempDir dir;
  REQUIRE(files::makeDirs(dir.path() + "/j/attempt-1").isOk());
  const std::string path = LogServer::logPath(dir.path(), "j", 1, 0);
  REQUIRE(files::writeFileAtomic(path, "one\n").isOk());
  std::atomic<bool> live{true};
  Collector c;
  LogServer server(dir.path(), [&](const std::string&, int, int) { return live.load(); }, c.sender());
  server.serve({.requestId = 1, .jobId = "j", .attempt = 1, .ranks = {}, .tailLines = 0, .follow = true});
  {
    std::unique_lock lock(c.mu);
    REQUIRE(c.cv.wait_for(lock, std::chrono::seconds(5), [&] { return c.byRank[0] == "one\n"; }));
  }
  FILE* f = std::fopen(path.c_str(), "a");
  std::fputs("two\n", f);
  std::fclose(f);
  live = false;
  REQUIRE(c.awaitDone());
  CHECK(c.byRank[0] == "one\ntwo\n");
}
