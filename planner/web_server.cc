#include "planner/web_server.h"

#include <chrono>
#include <future>
#include <map>
#include <sstream>

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include "common/http_listen.h"
#include "common/prometheus_text.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "planner/grpc_services.h"
#include "planner/web_assets.h"

namespace loom::planner {

namespace {

constexpr auto kCoreTimeout = std::chrono::seconds(10);

// Waits on a reply the core's loop gives through a callback. A core that stops drops its calls:
// that, like a loop too busy to answer, is UNAVAILABLE.
template <typename T>
class Reply {
 public:
  Reply() : future_(promise_->get_future()) {}
  auto callback() {
    return [promise = promise_](T value) { promise->set_value(std::move(value)); };
  }
  std::optional<T> wait() {
    if (future_.wait_for(kCoreTimeout) != std::future_status::ready) return std::nullopt;
    try {
      return future_.get();
    } catch (const std::future_error&) {
      return std::nullopt;
    }
  }

 private:
  std::shared_ptr<std::promise<T>> promise_ = std::make_shared<std::promise<T>>();
  std::future<T> future_;
};

const Status kNoAnswer = unavailable("the planner did not answer within 10 s (it may be stopping)");

int httpStatusOf(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kFailedPrecondition:
      return 409;
    case StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

void sendError(httplib::Response& res, const Status& status) {
  res.status = httpStatusOf(status.code());
  if (res.status == 401) res.set_header("WWW-Authenticate", "Bearer realm=\"loom\"");
  res.set_content(nlohmann::json{{"error", status.message()}, {"code", statusCodeName(status.code())}}.dump(),
                  "application/json");
}

void sendMessage(httplib::Response& res, const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  res.set_header("Cache-Control", "no-store");
  res.set_content(out, "application/json");
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ?name=INT, or `fallback`; INVALID_ARGUMENT naming the parameter.
StatusOr<int> intParam(const httplib::Request& req, const char* name, int fallback) {
  if (!req.has_param(name)) return fallback;
  const std::string text = req.get_param_value(name);
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 0 || value > 1'000'000'000)
    return invalidArgument("{}: \"{}\" is not a non-negative integer", name, text);
  return static_cast<int>(value);
}

// The first update of a watch: the job and all its events.
class FirstUpdate final : public JobWatcher {
 public:
  explicit FirstUpdate(std::function<void(StatusOr<JobUpdate>)> done) : done_(std::move(done)) {}
  bool onUpdate(const JobUpdate& update) override {
    done_(update);
    return false;
  }
  void onEnd(const Status& status) override {
    if (!status.isOk()) done_(status);
  }

 private:
  std::function<void(StatusOr<JobUpdate>)> done_;
};

// A log request's chunks gathered per rank (follow off: the request ends by itself).
class CollectedLogs final : public LogSink {
 public:
  explicit CollectedLogs(std::function<void(StatusOr<std::map<int, std::string>>)> done) : done_(std::move(done)) {}
  bool onChunk(int rank, int attempt, const std::string& data) override {
    logs_[rank] += data;
    return true;
  }
  void onEnd(const Status& status) override {
    if (status.isOk()) {
      done_(std::move(logs_));
    } else {
      done_(status);
    }
  }

 private:
  std::map<int, std::string> logs_;
  std::function<void(StatusOr<std::map<int, std::string>>)> done_;
};

}  // namespace

struct WebServer::Impl {
  PlannerCore* core;
  const PlannerMetrics* metrics;
  AccessControl* access;
  std::unique_ptr<HttpListener> listener;

  void routes(httplib::Server& http);
  // The caller, when its token names one of `roles`; otherwise nothing, the refusal sent.
  std::optional<Identity> caller(const httplib::Request& req, httplib::Response& res, std::initializer_list<Role> roles,
                                 std::string_view what);
  // Whether `caller` may `action` job `id` (its tenant's, or an admin); the refusal sent if not.
  bool mayActOn(const Identity& caller, const std::string& id, std::string_view action, httplib::Response& res);
  void metricsPage(const httplib::Request& req, httplib::Response& res);
  void listJobs(const httplib::Request& req, httplib::Response& res);
  void getJob(const std::string& id, const httplib::Request& req, httplib::Response& res);
  void jobMetrics(const std::string& id, const httplib::Request& req, httplib::Response& res);
  void jobLogs(const std::string& id, const httplib::Request& req, httplib::Response& res);
  void listNodes(const httplib::Request& req, httplib::Response& res);
};

std::optional<Identity> WebServer::Impl::caller(const httplib::Request& req, httplib::Response& res,
                                                std::initializer_list<Role> roles, std::string_view what) {
  auto identity = access->authenticateHttp(req.get_header_value("Authorization"));
  Status allowed = identity.isOk() ? requireRole(*identity, roles, what) : identity.status();
  if (!allowed.isOk()) {
    sendError(res, allowed);
    return std::nullopt;
  }
  return *identity;
}

bool WebServer::Impl::mayActOn(const Identity& caller, const std::string& id, std::string_view action,
                               httplib::Response& res) {
  auto job = core->job(id);
  Status allowed = job.isOk() ? mayActOnJob(caller, id, (*job)->tenant, action) : job.status();
  if (!allowed.isOk()) sendError(res, allowed);
  return allowed.isOk();
}

void WebServer::Impl::routes(httplib::Server& http) {
  http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) { metricsPage(req, res); });
  http.Get("/api/v1/jobs", [this](const httplib::Request& req, httplib::Response& res) { listJobs(req, res); });
  http.Get(R"(/api/v1/jobs/([^/]+))",
           [this](const httplib::Request& req, httplib::Response& res) { getJob(req.matches[1], req, res); });
  http.Get(R"(/api/v1/jobs/([^/]+)/metrics)", [this](const httplib::Request& req, httplib::Response& res) {
    jobMetrics(req.matches[1], req, res);
  });
  http.Get(R"(/api/v1/jobs/([^/]+)/logs)", [this](const httplib::Request& req, httplib::Response& res) {
    jobLogs(req.matches[1], req, res);
  });
  http.Get("/api/v1/nodes", [this](const httplib::Request& req, httplib::Response& res) { listNodes(req, res); });
  for (const WebAsset& asset : webAssets()) {
    const std::string path = asset.path == "index.html" ? "/" : "/" + asset.path;
    http.Get(path, [&asset](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(asset.content), asset.contentType);
    });
  }
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty()) sendError(res, notFound("no such page: {}", req.path));
  });
}

void WebServer::Impl::metricsPage(const httplib::Request& req, httplib::Response& res) {
  // Every job's series: an operator's view (Prometheus scrapes with an admin's token).
  if (!caller(req, res, {Role::kAdmin}, "read /metrics")) return;
  Reply<ClusterSnapshot> reply;
  core->snapshot(reply.callback());
  auto snapshot = reply.wait();
  if (!snapshot) return sendError(res, kNoAnswer);
  res.set_content(metrics->render(*snapshot), kPrometheusContentType);
}

void WebServer::Impl::listJobs(const httplib::Request& req, httplib::Response& res) {
  auto who = caller(req, res, {Role::kAdmin, Role::kUser}, "list jobs");
  if (!who) return;
  auto limit = intParam(req, "limit", 1000);
  if (!limit.isOk()) return sendError(res, limit.status());
  ListQuery query{.pageSize = 1000};
  if (who->role == Role::kUser) query.tenant = who->tenant;
  for (const auto& name : splitList(req.get_param_value("state"))) {
    v1::JobState state;
    if (!v1::JobState_Parse(name, &state) || state == v1::JOB_STATE_UNSPECIFIED)
      return sendError(res, invalidArgument("state: \"{}\" is not a job state", name));
    query.states.insert(fromProto(state));
  }
  v1::ListJobsResponse out;
  do {
    auto page = core->listJobs(query);
    if (!page.isOk()) return sendError(res, page.status());
    for (const auto& job : page->jobs) {
      if (out.jobs_size() == *limit) break;
      toProto(*job, v1::JOB_VIEW_BASIC, out.add_jobs());  // /api/v1/jobs/ID has the spec
    }
    query.pageToken = page->nextPageToken;
  } while (!query.pageToken.empty() && out.jobs_size() < *limit);
  sendMessage(res, out);
}

void WebServer::Impl::getJob(const std::string& id, const httplib::Request& req, httplib::Response& res) {
  auto who = caller(req, res, {Role::kAdmin, Role::kUser}, "read jobs");
  if (!who) return;
  Reply<StatusOr<JobUpdate>> reply;
  core->watchJob(id, std::make_shared<FirstUpdate>(reply.callback()));
  auto update = reply.wait();
  if (!update) return sendError(res, kNoAnswer);
  if (!update->isOk()) return sendError(res, update->status());
  // The update holds the job: its tenant decides, without a second lookup.
  const JobRecord& job = (*update)->job;
  if (Status allowed = mayActOnJob(*who, job.id, job.tenant, "read"); !allowed.isOk()) return sendError(res, allowed);
  (*update)->metrics.clear();  // /metrics has them all, page by page
  v1::JobUpdate out;
  toProto(**update, &out);
  sendMessage(res, out);
}

void WebServer::Impl::jobMetrics(const std::string& id, const httplib::Request& req, httplib::Response& res) {
  auto who = caller(req, res, {Role::kAdmin, Role::kUser}, "read jobs");
  if (!who || !mayActOn(*who, id, "read the metrics of", res)) return;
  v1::ListJobMetricsRequest request;
  request.set_job_id(id);
  for (const auto& name : splitList(req.get_param_value("names"))) request.add_names(name);
  for (const auto& rank : splitList(req.get_param_value("ranks"))) {
    char* end = nullptr;
    const long r = std::strtol(rank.c_str(), &end, 10);
    if (*end != '\0' || r < 0) return sendError(res, invalidArgument("ranks: \"{}\" is not a rank", rank));
    request.add_ranks(static_cast<int>(r));
  }
  auto pageSize = intParam(req, "page_size", 0);
  if (!pageSize.isOk()) return sendError(res, pageSize.status());
  request.set_page_size(*pageSize);
  request.set_page_token(req.get_param_value("page_token"));
  auto query = metricQueryOf(request);
  if (!query.isOk()) return sendError(res, query.status());
  Reply<StatusOr<MetricPage>> reply;
  core->listJobMetrics(std::move(query).value(), reply.callback());
  auto page = reply.wait();
  if (!page) return sendError(res, kNoAnswer);
  if (!page->isOk()) return sendError(res, page->status());
  v1::ListJobMetricsResponse out;
  for (const auto& m : (*page)->metrics) toProto(m, out.add_metrics());
  out.set_next_page_token(std::to_string((*page)->lastRow));
  out.set_more((*page)->more);
  sendMessage(res, out);
}

void WebServer::Impl::jobLogs(const std::string& id, const httplib::Request& req, httplib::Response& res) {
  auto who = caller(req, res, {Role::kAdmin, Role::kUser}, "read jobs");
  if (!who || !mayActOn(*who, id, "read the logs of", res)) return;
  auto rank = intParam(req, "rank", 0);
  auto tail = intParam(req, "tail", 200);
  auto attempt = intParam(req, "attempt", 0);
  for (const auto* p : {&rank, &tail, &attempt}) {
    if (!p->isOk()) return sendError(res, p->status());
  }
  LogQuery query{.jobId = id, .attempt = *attempt, .ranks = {*rank}, .tailLines = *tail, .follow = false};
  Reply<StatusOr<std::map<int, std::string>>> reply;
  auto sink = std::make_shared<CollectedLogs>(reply.callback());
  core->streamLogs(std::move(query), sink);
  auto logs = reply.wait();
  if (!logs) {
    core->stopLogs(sink);
    return sendError(res, kNoAnswer);
  }
  if (!logs->isOk()) return sendError(res, logs->status());
  auto it = (*logs)->find(*rank);
  res.set_header("Cache-Control", "no-store");
  res.set_content(it == (*logs)->end() ? std::string() : it->second, "text/plain; charset=utf-8");
}

void WebServer::Impl::listNodes(const httplib::Request& req, httplib::Response& res) {
  if (!caller(req, res, {Role::kAdmin, Role::kUser}, "list nodes")) return;
  Reply<std::vector<NodeView>> reply;
  core->listNodes(reply.callback());
  auto nodes = reply.wait();
  if (!nodes) return sendError(res, kNoAnswer);
  v1::ListNodesResponse out;
  for (const auto& node : *nodes) toProto(node, out.add_nodes());
  sendMessage(res, out);
}

StatusOr<std::unique_ptr<WebServer>> WebServer::start(const std::string& listenAddress, PlannerCore* core,
                                                     const PlannerMetrics* metrics, AccessControl* access,
                                                     const security::ServerTls& tls) {
  auto impl = std::make_unique<Impl>();
  impl->core = core;
  impl->metrics = metrics;
  impl->access = access;
  // HTTPS with the gRPC port's certificate. Callers authenticate with tokens: browsers hold no
  // client certificates, so none is asked for.
  ASSIGN_OR_RETURN(std::unique_ptr<httplib::Server> http,
                   makeHttpServer(tls.certFile, tls.keyFile, "--http-listen"));
  impl->routes(*http);
  ASSIGN_OR_RETURN(impl->listener, HttpListener::start(std::move(http), listenAddress, "--http-listen"));
  return std::unique_ptr<WebServer>(new WebServer(std::move(impl)));
}

WebServer::WebServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WebServer::~WebServer() { shutdown(); }

const std::string& WebServer::boundAddress() const { return impl_->listener->boundAddress(); }

void WebServer::shutdown() { impl_->listener->stop(); }

}  // namespace loom::planner
