#include "planner/planner_metrics.h"

#include <algorithm>
#include <chrono>

#include <prometheus/metric_family.h>

#include "common/prometheus_text.h"

namespace loom::planner {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// The worker metrics with a series of their own; any other is loom_job_metric{name=...}.
struct KnownMetric {
  const char* worker;
  const char* series;
  const char* help;
  bool counter;
};
constexpr KnownMetric kKnown[] = {
    {"loss", "loom_job_loss", "Training loss of the last step (rank 0).", false},
    {"eval_loss", "loom_job_eval_loss", "Loss of the last evaluation.", false},
    {"lr", "loom_job_learning_rate", "Learning rate of the last step.", false},
    {"grad_norm", "loom_job_grad_norm", "Global gradient norm of the last step (before clipping).", false},
    {"tokens_per_s", "loom_job_tokens_per_second", "Tokens trained per second in the last step, all ranks.", false},
    {"step_time_s", "loom_job_step_duration_seconds", "Wall time of the last step.", false},
    {"mfu", "loom_job_mfu_ratio", "Model FLOPs utilization of the last step.", false},
    {"loss_scale", "loom_job_loss_scale", "fp16 dynamic loss scale.", false},
    {"progress", "loom_job_progress_ratio", "Fraction of the job's steps done.", false},
    {"skipped_steps", "loom_job_skipped_steps_total", "Steps skipped for overflowed or non-finite gradients.", true},
    {"samples", "loom_job_samples_total", "Samples trained on.", true},
    {"rollout_requests_running", "loom_rollout_requests_running", "Requests being generated.", false},
    {"rollout_requests_waiting", "loom_rollout_requests_waiting", "Requests waiting for admission.", false},
    {"rollout_kv_blocks_used", "loom_rollout_kv_blocks_used", "KV cache blocks in use.", false},
    {"rollout_output_tokens_per_s", "loom_rollout_output_tokens_per_second", "Tokens generated per second.", false},
    {"rollout_prompt_tokens_per_s", "loom_rollout_prompt_tokens_per_second", "Prompt tokens prefilled per second.",
     false},
    {"rollout_preemptions", "loom_rollout_preemptions_total", "Sequences preempted for KV blocks (recomputed).", true},
    {"rollout_weights_version", "loom_rollout_weights_version", "Version of the weights being served.", false},
};

bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }
bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

ClientMetric valueMetric(double value, std::vector<prometheus::ClientMetric::Label> labels, bool counter) {
  ClientMetric m;
  m.label = std::move(labels);
  if (counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

// Families by name, in first-seen order, so that every series of one name is one family.
class Families {
 public:
  void add(const std::string& name, const std::string& help, bool counter, ClientMetric metric) {
    auto [it, inserted] = index_.emplace(name, families_.size());
    if (inserted) {
      MetricFamily family;
      family.name = name;
      family.help = help;
      family.type = counter ? MetricType::Counter : MetricType::Gauge;
      families_.push_back(std::move(family));
    }
    families_[it->second].metric.push_back(std::move(metric));
  }
  void gauge(const std::string& name, const std::string& help, double value,
             std::vector<ClientMetric::Label> labels = {}) {
    add(name, help, false, valueMetric(value, std::move(labels), false));
  }
  void counter(const std::string& name, const std::string& help, double value,
               std::vector<ClientMetric::Label> labels = {}) {
    add(name, help, true, valueMetric(value, std::move(labels), true));
  }
  std::vector<MetricFamily> take() { return std::move(families_); }

 private:
  std::map<std::string, size_t> index_;
  std::vector<MetricFamily> families_;
};

void addJobSeries(const JobRecord& job, Families& out) {
  const std::vector<ClientMetric::Label> jobLabel{{"job", job.id}};
  out.gauge("loom_job_info", "A live job: its name, kind and tenant (value 1).", 1,
            {{"job", job.id},
             {"name", job.spec.name},
             {"kind", jobKindName(job.spec.kind)},
             {"tenant", job.tenant}});
  out.gauge("loom_job_attempt", "The job's current attempt (1 for the first launch).", job.attempt, jobLabel);
  int64_t step = 0;
  for (const auto& r : job.ranks) step = std::max(step, r.step);
  out.gauge("loom_job_step", "Steps done by the job's furthest rank.", static_cast<double>(step), jobLabel);

  auto addMetric = [&](const std::string& name, double value, const std::string& rank) {
    SeriesName series = seriesOf(name);
    std::vector<ClientMetric::Label> labels = jobLabel;
    if (series.perRank != rank.empty()) {
      if (series.perRank) labels.push_back({"rank", rank});
      for (const auto& [k, v] : series.labels) labels.push_back({k, v});
      if (series.name.empty()) {
        out.gauge("loom_job_metric", "Any other metric the job's rank 0 reports, by its name.", value,
                  {{"job", job.id}, {"name", name}});
      } else {
        out.add(series.name, series.help, series.counter, valueMetric(value * series.scale, labels, series.counter));
      }
    }
  };
  for (const auto& [name, value] : job.metrics) addMetric(name, value, "");
  for (const auto& r : job.ranks) {
    for (const auto& [name, value] : r.metrics) addMetric(name, value, std::to_string(r.rank));
  }
}

class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(PlannerMetrics* metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics), method_(info->method()),
        unary_(info->type() == grpc::experimental::ServerRpcInfo::Type::UNARY),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      metrics_->observeRpc(method_, methods->GetSendStatus().error_code(), seconds, unary_);
    }
    methods->Proceed();
  }

 private:
  PlannerMetrics* metrics_;
  std::string method_;
  bool unary_;
  std::chrono::steady_clock::time_point start_;
};

class RpcInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(PlannerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new RpcInterceptor(metrics_, info);
  }

 private:
  PlannerMetrics* metrics_;
};

const char* codeName(int code) {
  static const char* kNames[] = {"OK",        "CANCELLED",         "UNKNOWN",        "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS", "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                 "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  return code >= 0 && code < 17 ? kNames[code] : "UNKNOWN";
}

}  // namespace

SeriesName seriesOf(const std::string& name) {
  for (const auto& k : kKnown) {
    if (name == k.worker) return {.name = k.series, .help = k.help, .counter = k.counter};
  }
  // memory.<what>_bytes: per rank.
  if (startsWith(name, "memory.") && endsWith(name, "_bytes")) {
    return {.name = "loom_job_memory_bytes",
            .help = "Memory of each rank by kind (parameters, gradients, optimizer state, peaks).",
            .labels = {{"kind", name.substr(7, name.size() - 7 - 6)}},
            .perRank = true};
  }
  // comm.<op>.busbw_GBps (the comms logger) and probe.<op>.busbw_GBps (the probe job).
  for (const char* prefix : {"comm.", "probe."}) {
    if (startsWith(name, prefix) && endsWith(name, ".busbw_GBps")) {
      const size_t from = std::char_traits<char>::length(prefix);
      return {.name = "loom_job_collective_bus_bandwidth_bytes_per_second",
              .help = "Bus bandwidth of a collective (nccl-tests' busbw), by op.",
              .scale = 1e9,
              .labels = {{"op", name.substr(from, name.size() - from - 11)}}};
    }
  }
  return {};
}

PlannerMetrics::PlannerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      rpcHandled_(prometheus::BuildCounter()
                      .Name("loom_grpc_server_handled_total")
                      .Help("RPCs completed by the planner, by method and status code.")
                      .Register(*registry_)),
      rpcSeconds_(prometheus::BuildHistogram()
                      .Name("loom_grpc_server_handling_seconds")
                      .Help("Time the planner took to answer a unary RPC, by method.")
                      .Register(*registry_)),
      placementWait_(prometheus::BuildHistogram()
                         .Name("loom_job_placement_wait_seconds")
                         .Help("Time a job waited for its ranks to be placed (from PENDING or RESTARTING).")
                         .Register(*registry_)
                         .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60,
                                                                         300, 1800, 3600})) {}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> PlannerMetrics::interceptorFactory() {
  return std::make_unique<RpcInterceptorFactory>(this);
}

void PlannerMetrics::observePlacementWait(double seconds) { placementWait_.Observe(seconds); }

void PlannerMetrics::observeRpc(const std::string& method, int code, double seconds, bool unary) {
  rpcHandled_.Add({{"method", method}, {"code", codeName(code)}}).Increment();
  if (unary) {
    rpcSeconds_
        .Add({{"method", method}},
             prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1, 2.5})
        .Observe(seconds);
  }
}

std::string PlannerMetrics::render(const ClusterSnapshot& snapshot) const {
  Families out;
  // Every state of every tenant that has jobs (and of no tenant: admins' jobs), 0 included.
  auto tenants = snapshot.jobsByTenant;
  tenants.try_emplace("");
  for (const auto& [tenant, byState] : tenants) {
    for (JobState state : {JobState::kPending, JobState::kLaunching, JobState::kRunning, JobState::kRestarting,
                           JobState::kCancelling, JobState::kSucceeded, JobState::kFailed, JobState::kCancelled}) {
      auto it = byState.find(state);
      out.gauge("loom_jobs", "Jobs by state and tenant (\"\": an admin's).", it == byState.end() ? 0 : it->second,
                {{"state", jobStateName(state)}, {"tenant", tenant}});
    }
  }
  out.counter("loom_job_restarts_total", "Relaunches of jobs, by cause (a failed attempt, or a preemption).",
              static_cast<double>(snapshot.restarts), {{"cause", "failure"}});
  out.counter("loom_job_restarts_total", "", static_cast<double>(snapshot.preemptions), {{"cause", "preemption"}});
  int connected = 0, detached = 0, cordoned = 0;
  for (const auto& node : snapshot.nodes) {
    (node.connected ? connected : detached) += 1;
    cordoned += node.cordoned ? 1 : 0;
    out.gauge("loom_node_slots", "Rank slots of an attached node.", node.slots, {{"node", node.nodeId}});
    out.gauge("loom_node_slots_used", "Rank slots of a node that hold a rank.", node.usedSlots,
              {{"node", node.nodeId}});
    if (node.gpus > 0) {
      out.gauge("loom_node_gpus", "GPUs a node offers to ranks of cuda jobs (loomd --gpus).", node.gpus,
                {{"node", node.nodeId}});
      out.gauge("loom_node_gpus_used", "GPUs of a node held by ranks of cuda jobs.", node.usedGpus,
                {{"node", node.nodeId}});
    }
  }
  out.gauge("loom_nodes", "Node daemons known to the planner, by state.", connected, {{"state", "connected"}});
  out.gauge("loom_nodes", "", detached, {{"state", "detached"}});
  out.gauge("loom_nodes_cordoned", "Nodes that take no new ranks (drained).", cordoned);
  for (const auto& job : snapshot.liveJobs) addJobSeries(job, out);

  std::vector<MetricFamily> families = registry_->Collect();
  for (auto& family : out.take()) families.push_back(std::move(family));
  return prometheusText(families);
}

}  // namespace loom::planner
