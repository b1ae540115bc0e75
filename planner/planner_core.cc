#include "planner/planner_core.h"

#include <algorithm>
#include <random>
#include <string_view>
#include <unordered_set>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/files.h"
#include "common/human_bytes.h"
#include "planner/job_plan.h"
#include "planner/placement.h"
#include "planner/plan_compiler.h"

namespace loom::planner {

namespace {

constexpr int kWatchMetricsBacklog = 200;

std::vector<Metric> metricsOf(const RankReport& report, int64_t nowMs) {
  std::vector<Metric> out;
  for (const auto& [name, value] : report.metrics) {
    out.push_back(Metric{.attempt = report.attempt, .rank = report.rank, .step = report.step, .name = name,
                         .value = value, .timeMs = report.timeMs ? report.timeMs : nowMs});
  }
  return out;
}

}  // namespace

Status PlannerOptions::validate() const {
  if (stateDir.empty()) return invalidArgument("state dir: required");
  if (nodeTimeoutMs <= 0) return invalidArgument("node timeout: must be positive");
  if (nodeHeartbeatIntervalMs <= 0 || nodeHeartbeatIntervalMs >= nodeTimeoutMs)
    return invalidArgument("node heartbeat interval: must be positive and below the node timeout");
  return Status::ok();
}

StatusOr<std::unique_ptr<PlannerCore>> PlannerCore::create(const PlannerOptions& options, const Clock* clock) {
  RETURN_IF_ERROR(options.validate());
  RETURN_IF_ERROR(files::makeDirs(options.stateDir));
  // Two planners on one database would each believe they own the jobs.
  const std::string lockPath = options.stateDir + "/planner.lock";
  int lockFd = ::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lockFd < 0) return errnoStatus("cannot open " + lockPath);
  if (::flock(lockFd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lockFd);
    return failedPrecondition("another loom-planner is using the state directory {} (it holds {})", options.stateDir,
                              lockPath);
  }
  auto store = StateStore::open(options.stateDir + "/planner.db");
  if (!store.isOk()) {
    ::close(lockFd);
    return store.status();
  }
  std::unique_ptr<PlannerCore> core(new PlannerCore(options, clock, std::move(store).value(), lockFd));
  ASSIGN_OR_RETURN(core->rankServices_, RankServiceAuthority::open(options.stateDir));
  Status recovered;
  core->loop_->runSync([&] { recovered = core->recover(); });
  RETURN_IF_ERROR(recovered);
  core->loop_->runEvery(std::chrono::milliseconds(std::max<int64_t>(100, options.nodeHeartbeatIntervalMs / 2)),
                        [c = core.get()] { c->expireNodes(); });
  return core;
}

PlannerCore::PlannerCore(const PlannerOptions& options, const Clock* clock, std::unique_ptr<StateStore> store,
                         int lockFd)
    : options_(options),
      clock_(clock),
      store_(std::move(store)),
      nextLogRequestId_(clock->nowMs() << 16),
      lockFd_(lockFd),
      loop_(std::make_unique<EventLoop>("planner", [this] { makeDurable(); })) {
  store_->groupCommits();
}

PlannerCore::~PlannerCore() {
  shutdown();
  ::close(lockFd_);
}

void PlannerCore::closeStreams() {
  loop_->runSync([this] {
    for (auto& [id, watcher] : watchers_) watcher->onEnd(unavailable("the planner is shutting down"));
    watchers_.clear();
    for (auto& [id, stream] : logStreams_) stream.sink->onEnd(unavailable("the planner is shutting down"));
    logStreams_.clear();
    for (auto& [id, node] : nodes_) {
      if (node.link) node.link->close(Status::ok());
    }
  });
}

void PlannerCore::shutdown() {
  closeStreams();
  loop_->stop();
}

// Jobs come back from the database as they were. Nodes do not: they re-register (daemons dial
// again) and report what their ranks did meanwhile. A node that does not come back within the
// node timeout has lost its ranks.
Status PlannerCore::recover() {
  ASSIGN_OR_RETURN(auto jobs, store_->loadJobs());
  const int64_t now = clock_->steadyMs();
  for (auto& job : jobs) {
    if (!job.requestId.empty()) jobByRequestId_[job.requestId] = job.id;
    creationIndex_[job.id] = jobOrder_.size();
    jobOrder_.push_back(job.id);
    queueIfPending(job);
    if (hasLiveAttempt(job.state)) {
      for (const auto& rank : job.ranks) {
        Node& node = nodes_[rank.nodeId];
        node.view.nodeId = rank.nodeId;
        node.detachedSinceMs = now;
        if (rank.state == RankState::kLaunching || rank.state == RankState::kRunning)
          node.liveRanks.insert({job.id, job.attempt, rank.rank});
      }
    }
    views_.publish(job);
    jobs_.emplace(job.id, std::move(job));
  }
  if (!jobs_.empty()) spdlog::info("recovered {} jobs from {}", jobs_.size(), options_.stateDir);
  ASSIGN_OR_RETURN(auto cordons, store_->loadCordons());
  for (auto& [nodeId, reason] : cordons) cordons_[nodeId] = Cordon{.reason = std::move(reason), .stored = true};
  return Status::ok();
}

JobRecord* PlannerCore::findJob(const std::string& jobId) {
  auto it = jobs_.find(jobId);
  return it == jobs_.end() ? nullptr : &it->second;
}

PlannerCore::Node* PlannerCore::nodeOfLink(const std::shared_ptr<NodeLink>& link) {
  // Every heartbeat and report asks: a lookup, not a scan of the nodes.
  auto named = nodeByLink_.find(link.get());
  if (named == nodeByLink_.end()) return nullptr;
  auto node = nodes_.find(named->second);
  if (node == nodes_.end() || node->second.link != link) return nullptr;
  return &node->second;
}

void PlannerCore::noteHeard(NodeLink& link) const { link.heard(clock_->steadyMs(), clock_->nowMs()); }

void PlannerCore::setLink(Node& node, std::shared_ptr<NodeLink> link) {
  if (node.link) {
    nodeByLink_.erase(node.link.get());
    node.view.lastSeenMs = node.link->heardWallMs();  // what a detached node shows
  }
  if (link) nodeByLink_[link.get()] = node.view.nodeId;
  node.link = std::move(link);
}

std::string PlannerCore::newJobId(const std::string& name) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  for (;;) {
    std::string id = fmt::format("{}-{:06x}", name, rng() & 0xffffff);
    if (!jobs_.count(id)) return id;
  }
}

// ---- jobs -------------------------------------------------------------------------------------

void PlannerCore::createJob(std::string specJson, std::string requestId, JobOwner owner,
                            std::function<void(const StatusOr<JobRecord>&, bool)> done) {
  // Parsing the spec and compiling the plan (which reads the model's config.json) need none of
  // the core's state: they run here, on the caller's thread, and leave the loop free.
  auto spec = parseJobSpec(specJson);
  std::optional<Plan> plan;
  Status compiled;
  if (spec.isOk() && checkHasPlan(*spec).isOk()) {
    auto p = compileJobPlan(*spec);
    compiled = p.status();
    if (p.isOk()) plan = std::move(p).value();
  }
  // Scoped by tenant, as stored (a request id stored before tenants existed is an admin's).
  if (!requestId.empty() && !owner.tenant.empty()) requestId = owner.tenant + "/" + requestId;
  loop_->post([this, spec = std::move(spec), plan = std::move(plan), compiled = std::move(compiled),
               requestId = std::move(requestId), owner = std::move(owner), done = std::move(done)]() mutable {
    if (!spec.isOk()) return done(spec.status(), false);
    if (!requestId.empty()) {
      auto it = jobByRequestId_.find(requestId);
      if (it != jobByRequestId_.end()) {
        const JobRecord& earlier = jobs_.at(it->second);
        if (earlier.specJson != spec->toJson().dump())
          return done(Status(StatusCode::kAlreadyExists,
                             fmt::format("request_id \"{}\" already created job {} from a different spec", requestId,
                                         earlier.id)),
                      false);
        makeDurable();  // it may have been created earlier in this turn
        return done(earlier, false);
      }
    }
    if (!compiled.isOk()) return done(compiled, false);
    if (auto quota = options_.quotas.find(owner.tenant); !owner.tenant.empty() && quota != options_.quotas.end()) {
      if (Status fits = fitsQuota(*spec, owner.tenant, quota->second); !fits.isOk()) return done(fits, false);
    }
    if (Status fits = checkNodeLocalGroupFits(nodeLocalGroup(spec->deepspeed), nodeCapacity()); !fits.isOk())
      return done(fits, false);
    JobRecord job;
    job.id = newJobId(spec->name);
    job.requestId = requestId;
    job.tenant = std::move(owner.tenant);
    job.owner = std::move(owner.user);
    job.spec = std::move(spec).value();
    job.specJson = job.spec.toJson().dump();
    job.createTimeMs = job.updateTimeMs = clock_->nowMs();
    job.state = JobState::kPending;
    job.reason = "waiting for placement";
    job.hasPlan = plan.has_value();
    std::vector<JobEvent> events{
        JobEvent{.seq = ++job.lastEventSeq, .timeMs = job.createTimeMs, .state = job.state, .attempt = 0, .reason = job.reason}};
    Status stored = store_->insertJob(job, events, plan ? &*plan : nullptr);
    if (!stored.isOk()) return done(stored.withContext("storing job " + job.id), false);
    if (!requestId.empty()) jobByRequestId_[requestId] = job.id;
    creationIndex_[job.id] = jobOrder_.size();
    jobOrder_.push_back(job.id);
    auto& ref = jobs_.emplace(job.id, std::move(job)).first->second;
    unpublished_.push_back(ref.id);
    queueIfPending(ref);
    if (plan) {
      spdlog::info("job {} created: {} ranks, kind {}, plan dp {} x sp {} x tp {} (ep {}), {} per rank",
                   ref.id, ref.spec.ranks, jobKindName(ref.spec.kind), plan->mesh.dp, plan->mesh.sp, plan->mesh.tp,
                   plan->mesh.ep, humanBytes(plan->memory.total()));
    } else {
      spdlog::info("job {} created: {} ranks, kind {}", ref.id, ref.spec.ranks, jobKindName(ref.spec.kind));
    }
    makeDurable();
    done(ref, true);
    schedule();
  });
}

StatusOr<JobView> PlannerCore::job(const std::string& jobId) const {
  JobView view = views_.find(jobId);
  if (!view) return notFound("job {} does not exist", jobId);
  return view;
}

void PlannerCore::getJobPlan(const std::string& jobId, std::function<void(const StatusOr<Plan>&)> done) {
  loop_->post([this, jobId, done = std::move(done)] {
    if (!findJob(jobId)) return done(notFound("job {} does not exist", jobId));
    done(store_->loadPlan(jobId));
  });
}

StatusOr<JobPage> PlannerCore::listJobs(const ListQuery& query) const {
  if (query.pageSize < 0 || query.pageSize > 1000) return invalidArgument("page_size: must be 0 to 1000");
  size_t start = 0;
  if (!query.pageToken.empty()) {
    try {
      start = std::stoul(query.pageToken);
    } catch (...) {
      return invalidArgument("page_token: not a token this server issued");
    }
  }
  const size_t pageSize = query.pageSize == 0 ? 100 : query.pageSize;
  auto found = views_.page(start, pageSize, [&query](const JobRecord& job) {
    if (query.tenant && job.tenant != *query.tenant) return false;
    return query.states.empty() || query.states.count(job.state) > 0;
  });
  JobPage page{.jobs = std::move(found.jobs), .nextPageToken = ""};
  if (found.more) page.nextPageToken = std::to_string(found.next);
  return page;
}

void PlannerCore::listJobMetrics(MetricQuery query, std::function<void(const StatusOr<MetricPage>&)> done) {
  loop_->post([this, query = std::move(query), done = std::move(done)] {
    if (!findJob(query.jobId)) return done(notFound("job {} does not exist", query.jobId));
    makeDurable();
    done(store_->loadMetricPage(query));
  });
}

void PlannerCore::cancelJob(const std::string& jobId, std::string reason, JobCallback done) {
  loop_->post([this, jobId, reason = std::move(reason), done = std::move(done)] {
    JobRecord* job = findJob(jobId);
    if (!job) return done(notFound("job {} does not exist", jobId));
    auto effects = JobLifecycle::requestCancel(*job, reason, clock_->nowMs());
    if (!effects.isOk()) return done(effects.status());
    commit(*job, *effects);
    makeDurable();
    done(*job);
  });
}

void PlannerCore::watchJob(const std::string& jobId, std::shared_ptr<JobWatcher> watcher) {
  loop_->post([this, jobId, watcher = std::move(watcher)] {
    const JobRecord* job = findJob(jobId);
    if (!job) return watcher->onEnd(notFound("job {} does not exist", jobId));
    auto events = store_->loadEvents(jobId);
    auto metrics = store_->loadMetrics(jobId, kWatchMetricsBacklog);
    if (!events.isOk()) return watcher->onEnd(events.status());
    if (!metrics.isOk()) return watcher->onEnd(metrics.status());
    makeDurable();
    if (!watcher->onUpdate(JobUpdate{*job, *events, *metrics})) return;
    if (isFinal(job->state)) return watcher->onEnd(Status::ok());
    watchers_.emplace(jobId, watcher);
  });
}

void PlannerCore::commit(JobRecord& job, const LifecycleEffects& effects, std::vector<Metric> metrics) {
  queueIfPending(job);
  Status stored = store_->updateJob(job, effects.events, metrics);
  if (!stored.isOk()) spdlog::error("job {}: cannot persist its state: {}", job.id, stored.toString());
  unpublished_.push_back(job.id);
  for (const auto& e : effects.events) spdlog::info("job {}: {}: {}", job.id, jobStateName(e.state), e.reason);
  notifyWatchers(job, effects.events, metrics);
  if (effects.attemptOver) releaseAttempt(job);
  if (effects.stopAttempt) stopAttempt(job, effects.stopReason, effects.stopPreempts);
  if (effects.needsPlacement || isFinal(job.state)) schedule();
}

void PlannerCore::makeDurable() {
  if (Status stored = store_->commitGroup(); !stored.isOk())
    spdlog::error("cannot persist the planner's state: {}", stored.toString());
  // A job written twice in the turn is published once, in the order of its first write (a new
  // job's place in the creation order is its first publication).
  std::unordered_set<std::string_view> published;
  for (const auto& id : unpublished_) {
    if (published.insert(id).second) views_.publish(jobs_.at(id));
  }
  unpublished_.clear();
  for (auto& [link, order] : outbox_) order(*link);  // a send only queues on the stream: it never calls back
  outbox_.clear();
}

void PlannerCore::sendAfterCommit(const std::shared_ptr<NodeLink>& link, std::function<void(NodeLink&)> order) {
  outbox_.emplace_back(link, std::move(order));
}

void PlannerCore::notifyWatchers(const JobRecord& job, const std::vector<JobEvent>& events,
                                 const std::vector<Metric>& metrics) {
  auto [begin, end] = watchers_.equal_range(job.id);
  if (begin != end) makeDurable();
  for (auto it = begin; it != end;) {
    bool keep = it->second->onUpdate(JobUpdate{job, events, metrics});
    if (keep && isFinal(job.state)) {
      it->second->onEnd(Status::ok());
      keep = false;
    }
    it = keep ? std::next(it) : watchers_.erase(it);
  }
}

void PlannerCore::stopAttempt(JobRecord& job, const std::string& reason, bool preempt) {
  std::set<std::string> nodeIds;
  for (const auto& r : job.ranks) nodeIds.insert(r.nodeId);
  for (const auto& id : nodeIds) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || !it->second.link) continue;
    KillOrder kill{.jobId = job.id, .attempt = job.attempt, .gracePeriodMs = job.spec.gracePeriodMs,
                   .reason = reason, .preempt = preempt};
    sendAfterCommit(it->second.link, [kill](NodeLink& link) { link.kill(kill); });
  }
  abandonPendingLaunch(job);  // last: settling those ranks may end the attempt and relaunch the job
}

// Orders still waiting for rank 0's port were never sent: their ranks end here, without a
// process, and give their slots back.
void PlannerCore::abandonPendingLaunch(JobRecord& job) {
  auto it = pendingLaunches_.find(job.id);
  if (it == pendingLaunches_.end()) return;
  PendingLaunch pending = std::move(it->second);
  pendingLaunches_.erase(it);
  if (pending.attempt != job.attempt) return;
  for (const auto& order : pending.orders) {
    for (const auto& assignment : order.ranks) {
      const std::string& nodeId = job.ranks[assignment.rank].nodeId;
      if (auto node = nodes_.find(nodeId); node != nodes_.end()) {
        node->second.liveRanks.erase({job.id, job.attempt, assignment.rank});
        node->second.view.usedSlots = static_cast<int>(node->second.liveRanks.size());
      }
      commit(job, JobLifecycle::markRankLost(job, assignment.rank, "not launched: the attempt ended first",
                                             clock_->nowMs()));
    }
  }
}

void PlannerCore::releaseAttempt(const JobRecord& job) {
  std::set<std::string> nodeIds;
  for (const auto& r : job.ranks) nodeIds.insert(r.nodeId);
  for (const auto& id : nodeIds) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || !it->second.link) continue;
    ReleaseOrder release{.jobId = job.id, .attempt = job.attempt};
    sendAfterCommit(it->second.link, [release](NodeLink& link) { link.release(release); });
  }
}

// ---- nodes ------------------------------------------------------------------------------------

void PlannerCore::rankReported(const std::shared_ptr<NodeLink>& link, RankReport report) {
  noteHeard(*link);
  loop_->post([this, link, report = std::move(report)] {
    Node* node = nodeOfLink(link);
    if (!node) return;  // a report on a stream that never registered or was replaced
    if (!rankHoldsSlot(report.event)) {
      node->liveRanks.erase({report.jobId, report.attempt, report.rank});
      node->view.usedSlots = static_cast<int>(node->liveRanks.size());
    }
    applyReport(node->view.nodeId, report);
    if (!rankHoldsSlot(report.event)) {
      releaseIfOver(*node, report);
      schedule();
    }
  });
}

// A rank that ended after its attempt was already settled (a straggler stopped after the job
// failed, or one a restarted node still held) is released on its own.
void PlannerCore::releaseIfOver(Node& node, const RankReport& report) {
  const JobRecord* job = findJob(report.jobId);
  bool over = !job || job->attempt != report.attempt ||
              std::all_of(job->ranks.begin(), job->ranks.end(), [](const RankStatus& r) {
                return r.state == RankState::kSucceeded || r.state == RankState::kFailed;
              });
  if (!over || !node.link) return;
  ReleaseOrder release{.jobId = report.jobId, .attempt = report.attempt};
  sendAfterCommit(node.link, [release](NodeLink& link) { link.release(release); });
}

void PlannerCore::applyReport(const std::string& nodeId, const RankReport& report) {
  JobRecord* job = findJob(report.jobId);
  if (!job || report.attempt != job->attempt) return;
  if (report.rank < 0 || report.rank >= static_cast<int>(job->ranks.size()) ||
      job->ranks[report.rank].nodeId != nodeId) {
    spdlog::warn("node {} reported rank {} of job {} attempt {}, which is not placed there", nodeId, report.rank,
                 report.jobId, report.attempt);
    return;
  }
  auto metrics = metricsOf(report, clock_->nowMs());
  auto effects = JobLifecycle::applyRankReport(*job, report, clock_->nowMs());
  commit(*job, effects, std::move(metrics));
}

void PlannerCore::streamLogs(LogQuery query, std::shared_ptr<LogSink> sink) {
  loop_->post([this, query = std::move(query), sink = std::move(sink)]() mutable {
    const JobRecord* job = findJob(query.jobId);
    if (!job) return sink->onEnd(notFound("job {} does not exist", query.jobId));
    if (job->attempt == 0) return sink->onEnd(failedPrecondition("job {} has not been launched yet", query.jobId));
    if (query.attempt == 0) query.attempt = job->attempt;
    if (query.attempt < 0 || query.attempt > job->attempt)
      return sink->onEnd(invalidArgument("attempt: job {} has attempts 1 to {}", query.jobId, job->attempt));
    for (int r : query.ranks) {
      if (r < 0 || r >= job->spec.ranks)
        return sink->onEnd(invalidArgument("rank: job {} has ranks 0 to {}", query.jobId, job->spec.ranks - 1));
    }
    // The current attempt's placement is known; an earlier attempt's logs are asked of every node.
    std::set<std::string> nodeIds;
    if (query.attempt == job->attempt) {
      for (const auto& r : job->ranks) {
        if (query.ranks.empty() || std::count(query.ranks.begin(), query.ranks.end(), r.rank)) nodeIds.insert(r.nodeId);
      }
    } else {
      for (const auto& [id, node] : nodes_) nodeIds.insert(id);
    }
    LogStream stream{.sink = sink, .jobId = query.jobId, .attempt = query.attempt, .waitingNodes = {}};
    query.requestId = nextLogRequestId_++;
    for (const auto& id : nodeIds) {
      auto it = nodes_.find(id);
      if (it == nodes_.end() || !it->second.link) {
        if (query.attempt == job->attempt)
          return sink->onEnd(unavailable("node {} holding ranks of job {} is not connected", id, query.jobId));
        continue;
      }
      stream.waitingNodes.insert(id);
    }
    if (stream.waitingNodes.empty()) return sink->onEnd(Status::ok());
    for (const auto& id : stream.waitingNodes) nodes_.at(id).link->requestLogs(query);
    logStreams_.emplace(query.requestId, std::move(stream));
  });
}

void PlannerCore::stopLogs(const std::shared_ptr<LogSink>& sink) {
  loop_->post([this, sink] {
    for (auto it = logStreams_.begin(); it != logStreams_.end(); ++it) {
      if (it->second.sink != sink) continue;
      for (const auto& id : it->second.waitingNodes) {
        auto node = nodes_.find(id);
        if (node != nodes_.end() && node->second.link) node->second.link->cancelLogs(it->first);
      }
      logStreams_.erase(it);
      return;
    }
  });
}

void PlannerCore::logDataReceived(const std::shared_ptr<NodeLink>& link, LogData data) {
  loop_->post([this, link, data = std::move(data)]() mutable {
    auto it = logStreams_.find(data.requestId);
    Node* node = nodeOfLink(link);
    if (it == logStreams_.end() || !node) return;
    LogStream& stream = it->second;
    if (!data.error.empty()) {
      stream.sink->onEnd(unavailable("node {}: {}", node->view.nodeId, data.error));
    } else if (!data.data.empty() && !stream.sink->onChunk(data.rank, stream.attempt, data.data)) {
      data.done = true;  // the reader left: stop every node, this one too
      for (const auto& id : stream.waitingNodes) {
        if (nodes_.count(id) && nodes_.at(id).link) nodes_.at(id).link->cancelLogs(it->first);
      }
      stream.waitingNodes.clear();
    } else if (!data.done) {
      return;
    }
    if (!data.error.empty()) {
      logStreams_.erase(it);
      return;
    }
    stream.waitingNodes.erase(node->view.nodeId);
    if (stream.waitingNodes.empty()) {
      stream.sink->onEnd(Status::ok());
      logStreams_.erase(it);
    }
  });
}

}  // namespace loom::planner
