#include "daemon/node_metrics.h"

#include <chrono>
#include <future>

#include <unistd.h>

#include "common/http_listen.h"
#include "common/process.h"
#include "common/prometheus_text.h"
#include "common/security/credentials.h"
#include "common/security/tokens.h"

namespace loom::daemon {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily family(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void add(MetricFamily& f, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  (f.type == MetricType::Counter ? m.counter.value : m.gauge.value) = value;
  f.metric.push_back(std::move(m));
}

}  // namespace

std::string renderNodeMetrics(const NodeSnapshot& s) {
  std::vector<MetricFamily> out;
  const std::vector<ClientMetric::Label> node{{"node", s.nodeId}};
  auto gauge = [&](const char* name, const char* help, double value) {
    out.push_back(family(name, help, MetricType::Gauge));
    add(out.back(), value, node);
  };
  gauge("loom_node_slots", "Ranks this node runs at once (--slots).", s.slots);
  gauge("loom_node_ranks_running", "Rank processes alive on this node.", static_cast<double>(s.liveRanks.size()));
  gauge("loom_node_planner_connected", "1 while the link to the planner is up.", s.plannerConnected ? 1 : 0);
  out.push_back(family("loom_node_planner_registrations_total", "Times this daemon (re)attached to the planner.",
                       MetricType::Counter));
  add(out.back(), static_cast<double>(s.plannerRegistrations), node);
  out.push_back(family("loom_node_rank_launches_total", "Rank processes started.", MetricType::Counter));
  add(out.back(), static_cast<double>(s.launches), node);
  out.push_back(family("loom_node_rank_exits_total",
                       "Rank processes ended, by outcome (succeeded, failed, preempted, launch_failed).",
                       MetricType::Counter));
  for (const char* outcome : {"succeeded", "failed", "preempted", "launch_failed"}) {
    auto it = s.exits.find(outcome);
    add(out.back(), it == s.exits.end() ? 0 : static_cast<double>(it->second), {{"node", s.nodeId}, {"outcome", outcome}});
  }
  out.push_back(family("loom_node_reports_relayed_total", "Rank reports sent up to the planner.", MetricType::Counter));
  add(out.back(), static_cast<double>(s.reportsRelayed), node);

  MetricFamily step = family("loom_rank_step", "The last step a live rank reported.", MetricType::Gauge);
  MetricFamily rss = family("loom_rank_resident_memory_bytes", "Resident memory of a live rank's process.",
                            MetricType::Gauge);
  MetricFamily cpu = family("loom_rank_cpu_seconds_total", "CPU time of a live rank's process (user and system).",
                            MetricType::Counter);
  for (const auto& r : s.liveRanks) {
    const std::vector<ClientMetric::Label> labels{{"job", r.jobId}, {"rank", std::to_string(r.rank)}};
    add(step, static_cast<double>(r.step), labels);
    if (auto usage = process::usage(r.pid)) {
      add(rss, static_cast<double>(usage->residentBytes), labels);
      add(cpu, usage->cpuSeconds, labels);
    }
  }
  out.push_back(std::move(step));
  out.push_back(std::move(rss));
  out.push_back(std::move(cpu));
  return prometheusText(out);
}

StatusOr<std::unique_ptr<NodeMetricsServer>> NodeMetricsServer::start(const std::string& listenAddress,
                                                                       Daemon* daemon,
                                                                       const NodeMetricsAccess& access) {
  ASSIGN_OR_RETURN(std::unique_ptr<httplib::Server> http,
                   makeHttpServer(access.tlsCertFile, access.tlsKeyFile, "--metrics-tls-cert"));
  http->Get("/metrics", [daemon, token = access.token](const httplib::Request& req, httplib::Response& res) {
    if (!token.empty() &&
        !security::constantTimeEquals(req.get_header_value("Authorization"), security::kBearerPrefix + token)) {
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer realm=\"loomd\"");
      res.set_content(req.has_header("Authorization")
                          ? "this token is not loomd's scrape token (--metrics-token-file)\n"
                          : "no credentials: send \"Authorization: Bearer TOKEN\" with loomd's scrape token "
                            "(--metrics-token-file)\n",
                      "text/plain");
      return;
    }
    auto promise = std::make_shared<std::promise<NodeSnapshot>>();
    auto future = promise->get_future();
    daemon->snapshot([promise](NodeSnapshot s) { promise->set_value(std::move(s)); });
    if (future.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      res.status = 503;
      res.set_content("loomd did not answer within 10 s (it may be stopping)\n", "text/plain");
      return;
    }
    try {
      res.set_content(renderNodeMetrics(future.get()), kPrometheusContentType);
    } catch (const std::future_error&) {
      res.status = 503;
      res.set_content("loomd is stopping\n", "text/plain");
    }
  });
  std::unique_ptr<NodeMetricsServer> server(new NodeMetricsServer());
  ASSIGN_OR_RETURN(server->listener_, HttpListener::start(std::move(http), listenAddress, "--metrics-listen"));
  return server;
}

NodeMetricsServer::~NodeMetricsServer() = default;

const std::string& NodeMetricsServer::boundAddress() const { return listener_->boundAddress(); }

}  // namespace loom::daemon
