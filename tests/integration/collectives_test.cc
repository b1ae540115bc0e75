// The probe's collective benchmark through the control plane: ranks rendezvous on the attempt's
// MASTER_PORT, run verified collectives, report bandwidth as job metrics; a silent peer fails
// the attempt through the collective watchdog and the restart policy takes over.
#include <csignal>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/integration/cluster.h"

using namespace loom;
using namespace loom::testing;

TEST_CASE("a 3-rank probe lists its kernels - benchmarks verified collectives - with the comms logger",
          "[integration]") {
  Standalone cluster(3);
  nlohmann::json patch{{"probe", {{"ticks", 0}, {"kernels", true}, {"collectives", {{"min_bytes", 8}, {"max_bytes", 65536}, {"iterations", 3}, {"warmup", 1}}}}},
                       {"kernels", {{"plugins", {"cpu"}}}},
                       {"deepspeed", {{"comms_logger", {{"enabled", true}}}}}};
  auto created = cluster.client->createJob(probeSpec(3, 0, 0, patch));
  REQUIRE(created.isOk());
  v1::Job job = awaitFinal(*cluster.client, created->job().id());
  INFO(job.reason());
  REQUIRE(job.state() == v1::SUCCEEDED);
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}) {
    CHECK(job.metrics().count(std::string("probe.") + op + ".busbw_GBps") == 1);
    CHECK(job.metrics().count(std::string("comm.") + op + ".count") == 1);
  }
  std::string log = files::readFile(cluster.dir.path() + "/jobs/" + job.id() + "/attempt-1/rank-0.log").value();
  CHECK(log.find("# collective benchmark: 3 ranks, float32") != std::string::npos);
  CHECK(log.find("# comms logger") != std::string::npos);
  // probe.kernels: each rank lists the implementations it loaded, the job's plugin first.
  CHECK(log.find("rank 0: kernels: kernel ABI 1") != std::string::npos);
  CHECK(log.find("loom-cpu [cpu, ") != std::string::npos);
  CHECK(log.find("cpu ops: loom-cpu (all)") != std::string::npos);
}

TEST_CASE("a stopped peer fails the attempt through the collective watchdog - then the job restarts", "[integration]") {
  Standalone cluster(3);
  nlohmann::json patch{{"probe", {{"ticks", 0}, {"collectives", {{"ops", {"all_reduce"}}, {"min_bytes", 8}, {"max_bytes", 8}, {"iterations", 100000}, {"warmup", 1}}}}},
                       {"restart", {{"max_restarts", 1}}},
                       {"timeouts", {{"collective_s", 2}, {"heartbeat_timeout_s", 60}, {"grace_period_s", 1}}}};
  auto created = cluster.client->createJob(probeSpec(3, 0, 0, patch));
  REQUIRE(created.isOk());
  const std::string id = created->job().id();
  v1::Job running = awaitRunning(*cluster.client, id);
  const std::string firstLog = cluster.dir.path() + "/jobs/" + id + "/attempt-1/rank-0.log";
  REQUIRE(eventually(
      [&] {
        auto log = files::readFile(firstLog);
        return log.isOk() && log->find("# collective benchmark") != std::string::npos;
      },
      std::chrono::seconds(30)));
  REQUIRE(::kill(running.ranks(2).pid(), SIGSTOP) == 0);

  v1::Job job = awaitFinal(*cluster.client, id, std::chrono::seconds(120));
  INFO(job.reason());
  CHECK(job.state() == v1::SUCCEEDED);
  CHECK(job.restarts() == 1);
  // Whichever running rank's watchdog fires first ends the attempt; the others are stopped.
  std::string log = files::readFile(firstLog).value() +
                    files::readFile(cluster.dir.path() + "/jobs/" + id + "/attempt-1/rank-1.log").value();
  // The op named is the timed all_reduce, or the barrier before it when the stop lands early.
  CHECK((log.find("all_reduce") != std::string::npos || log.find("barrier") != std::string::npos));
  CHECK(log.find("not complete after 2 s (the watchdog's timeout)") != std::string::npos);
}
