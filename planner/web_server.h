#pragma once

#include <memory>
#include <string>

#include "common/security/credentials.h"
#include "common/status.h"
#include "planner/access_control.h"
#include "planner/planner_core.h"
#include "planner/planner_metrics.h"

namespace loom::planner {

// The planner's HTTP side: Prometheus' /metrics, a read-only JSON API under /api/v1/ (the same
// messages as the gRPC API, in proto3's JSON mapping), and the web page that reads it (static
// files built into the binary, planner/web/). Read-only on purpose: changing a job goes through
// the gRPC API. Every route but the page's own files needs a bearer token ("Authorization:
// Bearer TOKEN"), with the gRPC API's rules: /metrics is an admin's, a user reads its tenant's
// jobs (access_control.h). HTTPS with the planner's certificate when it serves TLS.
//
//   GET /metrics                        text exposition format 0.0.4
//   GET /api/v1/jobs                    ListJobsResponse (?state=RUNNING&limit=N), without specs
//   GET /api/v1/jobs/ID                 JobUpdate: the job and all its events
//   GET /api/v1/jobs/ID/metrics         ListJobMetricsResponse (?names=a,b&ranks=0&page_token=T&page_size=N)
//   GET /api/v1/jobs/ID/logs            text/plain (?rank=R&tail=N&attempt=A)
//   GET /api/v1/nodes                   ListNodesResponse
//   GET /  /app.js  /style.css          the web page
class WebServer {
 public:
  // `listenAddress` is "host:port" (port 0: any free one).
  static StatusOr<std::unique_ptr<WebServer>> start(const std::string& listenAddress, PlannerCore* core,
                                                   const PlannerMetrics* metrics, AccessControl* access,
                                                   const security::ServerTls& tls);
  ~WebServer();

  // "host:port" with the port actually bound.
  const std::string& boundAddress() const;
  void shutdown();

 private:
  struct Impl;
  explicit WebServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::planner
