// A job goes from the API through the planner and node daemons to real rank processes.
#include <filesystem>
#include <set>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "common/files.h"
#include "common/process.h"
#include "tests/catch.h"
#include "tests/integration/cluster.h"

using namespace loom;
using namespace loom::testing;

TEST_CASE("a 4-rank probe job succeeds under loomd --standalone", "[integration]") {
  Standalone cluster(/*slots=*/4);
  auto created = cluster.client->createJob(probeSpec(4, 5, 50));
  REQUIRE(created.isOk());
  REQUIRE(created->created());
  v1::Job job = awaitFinal(*cluster.client, created->job().id());
  INFO(job.reason());
  CHECK(job.state() == v1::SUCCEEDED);
  CHECK(job.attempt() == 1);
  REQUIRE(job.ranks_size() == 4);
  for (const auto& r : job.ranks()) {
    CHECK(r.state() == v1::RANK_SUCCEEDED);
    CHECK(r.step() == 5);
    CHECK(r.node_id() == "node-a");
  }
  CHECK(job.metrics().at("probe.tick") == 5);
  CHECK(jobProcesses(job.id()).empty());
}

TEST_CASE("a 4-rank job splits over two daemons of 2 slots under a separate planner", "[integration]") {
  PlannerProcess planner;
  DaemonProcess a(planner.address, 2, "node-a");
  DaemonProcess b(planner.address, 2, "node-b");
  client::LoomClient client(planner.address, testCredentials().admin);
  REQUIRE(eventually(
      [&] {
        auto nodes = client.listNodes();
        return nodes.isOk() && nodes->size() == 2 && (*nodes)[0].connected() && (*nodes)[1].connected();
      },
      std::chrono::seconds(20)));

  auto created = client.createJob(probeSpec(4, 5, 50));
  REQUIRE(created.isOk());
  v1::Job job = awaitFinal(client, created->job().id());
  INFO(job.reason());
  CHECK(job.state() == v1::SUCCEEDED);
  std::set<std::string> nodes;
  for (const auto& r : job.ranks()) nodes.insert(r.node_id());
  CHECK(nodes == std::set<std::string>{"node-a", "node-b"});
  // Consecutive ranks share a node.
  CHECK(job.ranks(0).node_id() == job.ranks(1).node_id());
  CHECK(job.ranks(2).node_id() == job.ranks(3).node_id());
}

TEST_CASE("a tensor-parallel group is never split over nodes - one no node can hold is refused on submit", "[integration]") {
  PlannerProcess planner;
  DaemonProcess a(planner.address, 2, "node-a");
  DaemonProcess b(planner.address, 2, "node-b");
  client::LoomClient client(planner.address, testCredentials().admin);
  REQUIRE(eventually([&] { auto nodes = client.listNodes(); return nodes.isOk() && nodes->size() == 2; },
                     std::chrono::seconds(20)));
  TempDir dir;
  const std::string config = dir.path() + "/config.json";
  REQUIRE(files::writeFileAtomic(config, R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4})")
              .isOk());
  const nlohmann::json spec{{"name", "tp4"},
                            {"kind", "eval"},
                            {"resources", {{"ranks", 4}}},
                            {"model", {{"config", config}}},
                            {"data", {{"eval", dir.path() + "/eval.tokens"}, {"seq_len", 8}}},
                            {"deepspeed", {{"train_micro_batch_size_per_gpu", 1}, {"tensor_parallel", {{"autotp_size", 4}}}}}};
  // 4 slots, but 2 on each node: the 4 ranks of the group would straddle them, and no node can
  // ever hold them (the job would wait for ever). A node with room but busy makes the job wait,
  // saying why (tests/unit/planner/placement_test.cc).
  auto created = client.createJob(spec.dump());
  CHECK(created.status().code() == StatusCode::kFailedPrecondition);
  CHECK(created.status().message() ==
        "deepspeed.tensor_parallel.autotp_size 4: each group of 4 ranks must lie inside one node, and the largest of "
        "the 2 attached nodes has 2 slots");
  // A group of 2 fits each node: the job is placed, one group per node.
  nlohmann::json halves = spec;
  halves["deepspeed"]["tensor_parallel"]["autotp_size"] = 2;
  auto placed = client.createJob(halves.dump());
  INFO(placed.status().toString());
  REQUIRE(placed.isOk());
  REQUIRE(client.cancelJob(placed->job().id()).isOk());
}

TEST_CASE("a job that does not fit stays PENDING with the reason - and runs once slots free up", "[integration]") {
  Standalone cluster(/*slots=*/2);
  auto pendingReason = [&](const std::string& id) {
    auto job = cluster.client->getJob(id);
    return job.isOk() && job->state() == v1::PENDING ? job->reason() : std::string();
  };
  auto busy = cluster.client->createJob(probeSpec(2, 1000, 50));
  REQUIRE(busy.isOk());
  awaitRunning(*cluster.client, busy->job().id());

  auto waiting = cluster.client->createJob(probeSpec(2, 2, 10));
  auto tooBig = cluster.client->createJob(probeSpec(3, 1, 10));
  REQUIRE(waiting.isOk());
  REQUIRE(tooBig.isOk());
  REQUIRE(eventually([&] { return pendingReason(waiting->job().id()) == "waiting for 2 free slots: 0 free on 1 node (node-a 0)"; },
                     std::chrono::seconds(10)));
  REQUIRE(eventually([&] { return pendingReason(tooBig->job().id()) == "waiting for nodes: needs 3 slots, the 1 attached node has 2 in all"; },
                     std::chrono::seconds(10)));

  // Gang placement: freeing the slots lets the waiting job run whole; the big one is never
  // partly placed.
  REQUIRE(cluster.client->cancelJob(busy->job().id()).isOk());
  CHECK(awaitFinal(*cluster.client, waiting->job().id()).state() == v1::SUCCEEDED);
  auto stillPending = cluster.client->getJob(tooBig->job().id());
  CHECK(stillPending->state() == v1::PENDING);
  CHECK(stillPending->attempt() == 0);
  REQUIRE(cluster.client->cancelJob(tooBig->job().id()).isOk());
}

TEST_CASE("logs: every rank's output - one rank - and the last N lines", "[integration]") {
  Standalone cluster(2);
  auto created = cluster.client->createJob(probeSpec(2, 4, 10));
  REQUIRE(created.isOk());
  const std::string id = created->job().id();
  REQUIRE(awaitFinal(*cluster.client, id).state() == v1::SUCCEEDED);

  auto collect = [&](std::vector<int> ranks, int tail) {
    v1::GetJobLogsRequest request;
    request.set_job_id(id);
    for (int r : ranks) request.add_ranks(r);
    request.set_tail_lines(tail);
    std::map<int, std::string> out;
    Status s = cluster.client->streamLogs(request, [&](const v1::LogChunk& c) {
      out[c.rank()] += c.data();
      return true;
    });
    REQUIRE(s.isOk());
    return out;
  };
  auto all = collect({}, 0);
  REQUIRE(all.size() == 2);
  CHECK(all[0].find("rank 0: tick 4/4") != std::string::npos);
  CHECK(all[1].find("rank 1: tick 4/4") != std::string::npos);
  auto one = collect({1}, 2);
  REQUIRE(one.size() == 1);
  CHECK(one[1] == "rank 1: tick 3/4\nrank 1: tick 4/4\n");
}

TEST_CASE("logs --follow streams until the ranks end", "[integration]") {
  Standalone cluster(1);
  auto created = cluster.client->createJob(probeSpec(1, 10, 50));
  REQUIRE(created.isOk());
  awaitRunning(*cluster.client, created->job().id());
  v1::GetJobLogsRequest request;
  request.set_job_id(created->job().id());
  request.set_follow(true);
  std::string out;
  REQUIRE(cluster.client->streamLogs(request, [&](const v1::LogChunk& c) {
                          out += c.data();
                          return true;
                        }).isOk());
  CHECK(out.find("rank 0: tick 10/10") != std::string::npos);
}

TEST_CASE("cancelling a two-node job at once leaves nothing behind", "[integration]") {
  PlannerProcess planner;
  DaemonProcess a(planner.address, 2, "node-a");
  DaemonProcess b(planner.address, 2, "node-b");
  client::LoomClient client(planner.address, testCredentials().admin);
  REQUIRE(eventually([&] { auto n = client.listNodes(); return n.isOk() && n->size() == 2; }, std::chrono::seconds(20)));
  for (int i = 0; i < 3; ++i) {
    auto created = client.createJob(probeSpec(4, 1000, 50));
    REQUIRE(created.isOk());
    REQUIRE(client.cancelJob(created->job().id()).isOk());
    v1::Job job = awaitFinal(client, created->job().id());
    CHECK(job.state() == v1::CANCELLED);
    CHECK(jobProcesses(job.id()).empty());
  }
  // Every slot is free again: a job needing all four runs.
  auto full = client.createJob(probeSpec(4, 1, 10));
  REQUIRE(full.isOk());
  CHECK(awaitFinal(client, full->job().id()).state() == v1::SUCCEEDED);
}

TEST_CASE("a second loomd with a node id already attached is refused", "[integration]") {
  PlannerProcess planner;
  DaemonProcess a(planner.address, 2, "same");
  client::LoomClient client(planner.address, testCredentials().admin);
  REQUIRE(eventually([&] { auto n = client.listNodes(); return n.isOk() && n->size() == 1 && (*n)[0].connected(); },
                     std::chrono::seconds(20)));
  DaemonProcess b(planner.address, 3, "same");
  REQUIRE(eventually(
      [&] {
        auto log = files::readFile(b.stateDir() + "/loomd.log");
        return log.isOk() && log->find("node id same is attached already") != std::string::npos;
      },
      std::chrono::seconds(20)));
  auto nodes = client.listNodes();
  REQUIRE(nodes->size() == 1);
  CHECK((*nodes)[0].slots() == 2);  // the first daemon kept its place
}

namespace {

// NAME's value in a live process's environment ("" when absent).
std::string environmentOf(int pid, const std::string& name) {
  auto text = files::readFile("/proc/" + std::to_string(pid) + "/environ");
  if (!text.isOk()) return "";
  const std::string prefix = name + "=";
  for (size_t begin = 0; begin < text->size();) {
    const size_t end = std::min(text->find('\0', begin), text->size());
    if (text->compare(begin, prefix.size(), prefix) == 0) return text->substr(begin + prefix.size(), end - begin - prefix.size());
    begin = end + 1;
  }
  return "";
}

}  // namespace

TEST_CASE("GPUs are placement resources: two cuda jobs on a two-GPU node see different GPUs, a third waits",
          "[integration]") {
  // Fake devices: a probe job touches no GPU, so the node's two GPUs need not exist.
  PlannerProcess planner;
  DaemonProcess node(planner.address, 4, "node-a", "", {"--gpus", "0,1"});
  client::LoomClient client(planner.address, testCredentials().admin);
  auto cuda = [](const std::string& name, int ranks) {
    return probeSpec(ranks, 1000, 50, {{"name", name}, {"resources", {{"ranks", ranks}, {"device", "cuda"}}}});
  };
  auto a = client.createJob(cuda("gpu-a", 1));
  auto b = client.createJob(cuda("gpu-b", 1));
  REQUIRE(a.isOk());
  REQUIRE(b.isOk());
  v1::Job runningA = awaitRunning(client, a->job().id());
  v1::Job runningB = awaitRunning(client, b->job().id());
  const std::string gpuA = environmentOf(runningA.ranks(0).pid(), "CUDA_VISIBLE_DEVICES");
  const std::string gpuB = environmentOf(runningB.ranks(0).pid(), "CUDA_VISIBLE_DEVICES");
  CHECK(std::set<std::string>{gpuA, gpuB} == std::set<std::string>{"0", "1"});
  CHECK(environmentOf(runningA.ranks(0).pid(), "CUDA_DEVICE_ORDER") == "PCI_BUS_ID");

  // The node has slots left but no GPU: a third cuda job waits, a cpu job runs.
  auto c = client.createJob(cuda("gpu-c", 1));
  auto cpu = client.createJob(probeSpec(1, 1000, 50, {{"name", "cpu-d"}}));
  REQUIRE(c.isOk());
  REQUIRE(cpu.isOk());
  v1::Job runningCpu = awaitRunning(client, cpu->job().id());
  CHECK(environmentOf(runningCpu.ranks(0).pid(), "CUDA_VISIBLE_DEVICES").empty());
  REQUIRE(eventually(
      [&] {
        auto job = client.getJob(c->job().id());
        return job.isOk() && job->reason() == "waiting for 1 free GPU slot: 0 free on 1 node (node-a 0)";
      },
      std::chrono::seconds(10)));
  auto nodes = client.listNodes();
  REQUIRE(nodes.isOk());
  REQUIRE(nodes->size() == 1);
  CHECK((*nodes)[0].gpus() == 2);
  CHECK((*nodes)[0].used_gpus() == 2);

  // A's GPU goes to C once A has ended.
  REQUIRE(client.cancelJob(a->job().id()).isOk());
  v1::Job runningC = awaitRunning(client, c->job().id());
  CHECK(environmentOf(runningC.ranks(0).pid(), "CUDA_VISIBLE_DEVICES") == gpuA);
  // A three-rank cuda job is larger than the node's GPUs: it waits, saying so.
  auto big = client.createJob(cuda("gpu-big", 3));
  REQUIRE(big.isOk());
  REQUIRE(eventually(
      [&] {
        auto job = client.getJob(big->job().id());
        return job.isOk() && job->reason() == "waiting for nodes: needs 3 GPU slots, the 1 attached node has 2 in all";
      },
      std::chrono::seconds(10)));
  for (const auto& id : {b->job().id(), c->job().id(), cpu->job().id(), big->job().id()})
    REQUIRE(client.cancelJob(id).isOk());
}

TEST_CASE("loomd --run-as: ranks run as the unprivileged user, and the job still reports and succeeds",
          "[integration]") {
  if (::geteuid() != 0) {
    WARN("skipped: loomd --run-as needs root (CI runs as root)");
    return;
  }
  auto nobody = process::lookupUser("nobody");
  REQUIRE(nobody.isOk());
  // The ranks' user must be able to run the build's loom-worker: every directory above it open
  // to others (a clone under /root, mode 0700, is not).
  for (std::filesystem::path p = std::filesystem::canonical(binary("loom-worker")).parent_path();; p = p.parent_path()) {
    struct stat dir {};
    if (::stat(p.c_str(), &dir) == 0 && (dir.st_mode & S_IXOTH) == 0) {
      WARN("skipped: user nobody cannot reach loom-worker (" << p.string() << " is closed to others)");
      return;
    }
    if (p == p.root_path()) break;
  }
  PlannerProcess planner;
  TempDir state;
  REQUIRE(::chmod(state.path().c_str(), 0755) == 0);  // the ranks' user must reach its rank directory
  DaemonProcess node(planner.address, 2, "node-a", state.path(), {"--run-as", "nobody"});
  client::LoomClient client(planner.address, testCredentials().admin);
  auto created = client.createJob(probeSpec(2, 40, 50));
  REQUIRE(created.isOk());
  v1::Job running = awaitRunning(client, created->job().id());
  for (const auto& rank : running.ranks()) {
    auto status = files::readFile("/proc/" + std::to_string(rank.pid()) + "/status");
    REQUIRE(status.isOk());
    const auto uid = status->find("\nUid:");
    REQUIRE(uid != std::string::npos);
    std::istringstream fields(status->substr(uid + 5));
    uid_t real = 0, effective = 0;
    fields >> real >> effective;
    CHECK(real == nobody->uid);
    CHECK(effective == nobody->uid);
  }
  CHECK(awaitFinal(client, created->job().id()).state() == v1::SUCCEEDED);
  struct stat socket {};
  REQUIRE(::stat((state.path() + "/report.sock").c_str(), &socket) == 0);
  CHECK(socket.st_uid == nobody->uid);
  CHECK((socket.st_mode & 0777) == 0600);

  // A user the machine does not know is refused at start, named.
  TempDir other;
  Child unknown(binary("loomd"), {"--planner", planner.address, "--state-dir", other.path(), "--run-as", "no-such-user"},
                other.path() + "/loomd.log");
  REQUIRE(eventually([&] { return !process::isAlive(unknown.pid()); }, std::chrono::seconds(10)));
  CHECK(files::readFile(other.path() + "/loomd.log").value().find("--run-as: user no-such-user is not in") !=
        std::string::npos);
}
