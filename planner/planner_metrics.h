#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include "planner/job.h"
#include "planner/planner_core.h"

namespace loom::planner {

// The planner's /metrics: what the core's state says at scrape time (jobs by state, restarts,
// nodes and slots, each live job's step, loss, throughput, memory per rank, rollout engine
// figures) and what is observed as it happens (RPC latencies, placement waits). Names and
// labels follow Prometheus' conventions: base units in the name, `_total` counters, and no
// label beyond the job id, the rank, the node and small fixed sets.
class PlannerMetrics {
 public:
  PlannerMetrics();

  // Counts every RPC by method and status code and times the unary ones; installed on the gRPC
  // server (ServerBuilder::experimental().SetInterceptorCreators).
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> interceptorFactory();
  // Seconds a job waited, from PENDING (or RESTARTING) until placed.
  void observePlacementWait(double seconds);
  // The text exposition format (version 0.0.4) of everything: the observed metrics and those of
  // `snapshot`.
  std::string render(const ClusterSnapshot& snapshot) const;

  // Called by the interceptor.
  void observeRpc(const std::string& method, int code, double seconds, bool unary);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& rpcHandled_;
  prometheus::Family<prometheus::Histogram>& rpcSeconds_;
  prometheus::Histogram& placementWait_;
};

// A worker's metric name as the Prometheus series it is shown as, with its labels beyond the
// job's ("rank", "kind", "op"); the name is empty for a metric shown only as
// loom_job_metric{name=...}. Exposed for its tests.
struct SeriesName {
  std::string name;
  std::string help;
  bool counter = false;
  double scale = 1;  // to base units (GB/s to bytes/s)
  std::map<std::string, std::string> labels;
  bool perRank = false;  // one series per rank (memory), not rank 0's alone
};
SeriesName seriesOf(const std::string& workerMetric);

}  // namespace loom::planner
