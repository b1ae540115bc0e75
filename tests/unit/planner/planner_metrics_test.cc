#include "planner/planner_metrics.h"

#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

namespace {

JobRecord runningJob() {
  JobRecord job;
  job.id = "train-1";
  job.spec = parseJobSpec(R"({"name": "p", "kind": "probe", "resources": {"ranks": 2}})").value();
  job.state = JobState::kRunning;
  job.attempt = 2;
  job.ranks = {RankStatus{.rank = 0, .step = 7}, RankStatus{.rank = 1, .step = 8}};
  job.ranks[0].metrics = {{"memory.peak_rss_bytes", 1024}, {"loss", 0.1}};
  job.ranks[1].metrics = {{"memory.peak_rss_bytes", 2048}, {"loss", 0.2}};
  job.metrics = {{"loss", 2.0000000000000004}, {"skipped_steps", 3}, {"comm.all_reduce.busbw_GBps", 1.5},
                 {"moe.aux_loss", 0.25}, {"memory.peak_rss_bytes", 1024}};
  return job;
}

bool contains(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

}  // namespace

TEST_CASE("planner metrics - worker metrics become conventional series", "[planner]") {
  CHECK(seriesOf("loss").name == "loom_job_loss");
  CHECK(seriesOf("skipped_steps").counter);
  CHECK(seriesOf("skipped_steps").name == "loom_job_skipped_steps_total");
  const SeriesName memory = seriesOf("memory.optimizer_state_bytes");
  CHECK(memory.name == "loom_job_memory_bytes");
  CHECK(memory.perRank);
  CHECK(memory.labels.at("kind") == "optimizer_state");
  const SeriesName busbw = seriesOf("comm.all_to_all_single.busbw_GBps");
  CHECK(busbw.labels.at("op") == "all_to_all_single");
  CHECK(busbw.scale == 1e9);
  CHECK(seriesOf("moe.aux_loss").name.empty());  // shown as loom_job_metric{name=...}
}

TEST_CASE("planner metrics - the text has every job series with exact values, and RPCs counted", "[planner]") {
  PlannerMetrics metrics;
  metrics.observeRpc("/loom.v1.JobService/GetJob", 0, 0.002, true);
  metrics.observeRpc("/loom.v1.JobService/GetJob", 5, 0.001, true);
  metrics.observeRpc("/loom.v1.JobService/WatchJob", 1, 30, false);
  metrics.observePlacementWait(0.2);
  ClusterSnapshot snapshot;
  snapshot.jobsByTenant = {{"", {{JobState::kRunning, 1}, {JobState::kSucceeded, 4}}},
                           {"team-a", {{JobState::kPending, 2}}}};
  snapshot.restarts = 2;
  snapshot.preemptions = 1;
  snapshot.liveJobs = {runningJob()};
  snapshot.nodes = {NodeView{.nodeId = "n1", .slots = 4, .usedSlots = 2, .connected = true}};
  const std::string text = metrics.render(snapshot);

  CHECK(contains(text, "# TYPE loom_job_loss gauge"));
  CHECK(contains(text, R"(loom_job_loss{job="train-1"} 2.0000000000000004)"));  // round-trips
  CHECK(contains(text, R"(loom_job_step{job="train-1"} 8)"));                     // the furthest rank
  CHECK(contains(text, "# TYPE loom_job_skipped_steps_total counter"));
  CHECK(contains(text, R"(loom_job_skipped_steps_total{job="train-1"} 3)"));
  CHECK(contains(text, R"(loom_job_memory_bytes{job="train-1",rank="1",kind="peak_rss"} 2048)"));
  CHECK(contains(text, R"(loom_job_collective_bus_bandwidth_bytes_per_second{job="train-1",op="all_reduce"} 1500000000)"));
  CHECK(contains(text, R"(loom_job_metric{job="train-1",name="moe.aux_loss"} 0.25)"));
  CHECK(contains(text, R"(loom_jobs{state="SUCCEEDED",tenant=""} 4)"));
  CHECK(contains(text, R"(loom_jobs{state="FAILED",tenant=""} 0)"));
  CHECK(contains(text, R"(loom_jobs{state="PENDING",tenant="team-a"} 2)"));
  CHECK(contains(text, R"(loom_jobs{state="RUNNING",tenant="team-a"} 0)"));
  CHECK(contains(text, R"(loom_job_restarts_total{cause="preemption"} 1)"));
  CHECK(contains(text, R"(loom_node_slots_used{node="n1"} 2)"));
  CHECK(contains(text, R"(loom_grpc_server_handled_total{code="NOT_FOUND",method="/loom.v1.JobService/GetJob"} 1)"));
  CHECK(contains(text, R"(loom_grpc_server_handled_total{code="CANCELLED",method="/loom.v1.JobService/WatchJob"} 1)"));
  CHECK(contains(text, R"(loom_grpc_server_handling_seconds_count{method="/loom.v1.JobService/GetJob"} 2)"));
  // A stream's lifetime is no latency: WatchJob is counted, not timed.
  CHECK(text.find(R"(loom_grpc_server_handling_seconds_count{method="/loom.v1.JobService/WatchJob"})") ==
        std::string::npos);
  CHECK(contains(text, R"(loom_job_placement_wait_seconds_bucket{le="0.5"} 1)"));
  // One HELP and TYPE per family, even for series added in two places.
  size_t types = 0;
  for (size_t at = text.find("# TYPE loom_job_restarts_total "); at != std::string::npos;
       at = text.find("# TYPE loom_job_restarts_total ", at + 1))
    ++types;
  CHECK(types == 1);
}
