// PlannerCore's nodes: a daemon's attach (and the ranks it still has), heartbeats and expiry, the
// node list, and cordons: drain (preempting the jobs on it) and uncordon. The jobs' side is
// planner_core.cc.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "planner/planner_core.h"

namespace loom::planner {

void PlannerCore::nodeRegistered(std::shared_ptr<NodeLink> link, NodeRegistration registration) {
  loop_->post([this, link = std::move(link), registration = std::move(registration)] {
    Node& node = nodes_[registration.nodeId];
    const int64_t now = clock_->steadyMs();
    if (node.link && node.link != link) {
      // Another daemon process with this node id. A restarted one replaces its stale stream; a
      // second live one (a node id given twice) is refused until the first goes quiet.
      bool firstIsAlive = node.instanceId != registration.instanceId &&
                          now - node.link->heardSteadyMs() < 3 * options_.nodeHeartbeatIntervalMs;
      if (firstIsAlive) {
        link->close(Status(StatusCode::kAlreadyExists,
                           fmt::format("node id {} is attached already (from {}); give each loomd its own --node-id",
                                       registration.nodeId, node.view.address)));
        return;
      }
      node.link->close(Status::ok());
    }
    // A daemon that drained itself as it stopped is followed by a new one, which takes ranks again.
    if (auto c = cordons_.find(registration.nodeId);
        c != cordons_.end() && !c->second.stored && node.instanceId != registration.instanceId) {
      spdlog::info("node {}: a new daemon attached: the cordon it left as it stopped is lifted", registration.nodeId);
      cordons_.erase(c);
    }
    node.view.nodeId = registration.nodeId;
    noteHeard(*link);
    setLink(node, link);
    node.instanceId = registration.instanceId;
    node.view.hostname = registration.hostname;
    node.view.address = registration.address;
    node.view.slots = registration.slots;
    node.view.gpus = registration.gpus;
    node.view.connected = true;
    node.detachedSinceMs = 0;
    spdlog::info("node {} attached: {} slots, {} GPUs, address {}, holding {} ranks", registration.nodeId,
                 registration.slots, registration.gpus > 0 ? std::to_string(registration.gpus) : "uncounted",
                 registration.address, registration.ranks.size());
    reconcileNode(node, registration);
    schedule();
  });
}

// A node's registration lists every rank it holds. The planner brings its records up to date
// with it, stops ranks that no longer belong to a live attempt, and fails ranks it expected on
// that node that the node does not have.
void PlannerCore::reconcileNode(Node& node, const NodeRegistration& registration) {
  const std::string& nodeId = registration.nodeId;
  // The slots first, from the whole registration: applying a report may end a job and place
  // another, which must see this node as it really is.
  node.liveRanks.clear();
  std::set<std::tuple<std::string, int, int>> reported;
  for (const auto& report : registration.ranks) {
    reported.insert({report.jobId, report.attempt, report.rank});
    if (rankHoldsSlot(report.event)) node.liveRanks.insert({report.jobId, report.attempt, report.rank});
  }
  node.view.usedSlots = static_cast<int>(node.liveRanks.size());
  for (const auto& report : registration.ranks) {
    applyReport(nodeId, report);
    if (!rankHoldsSlot(report.event)) releaseIfOver(node, report);
    const JobRecord* job = findJob(report.jobId);
    bool wanted = job && job->attempt == report.attempt &&
                  (job->state == JobState::kLaunching || job->state == JobState::kRunning);
    if (!wanted && rankHoldsSlot(report.event)) {
      KillOrder kill{.jobId = report.jobId, .attempt = report.attempt,
                     .gracePeriodMs = job ? job->spec.gracePeriodMs : 10'000,
                     .reason = "its attempt is no longer running"};
      sendAfterCommit(node.link, [kill](NodeLink& link) { link.kill(kill); });
    }
  }
  for (auto& [id, job] : jobs_) {
    if (!hasLiveAttempt(job.state)) continue;
    for (const auto& rank : job.ranks) {
      if (rank.nodeId != nodeId || reported.count({job.id, job.attempt, rank.rank})) continue;
      if (rank.state != RankState::kLaunching && rank.state != RankState::kRunning) continue;
      if (pendingLaunches_.count(job.id)) continue;  // not launched there yet
      auto effects = JobLifecycle::markRankLost(job, rank.rank, "node " + nodeId + " re-registered without it",
                                                clock_->nowMs());
      commit(job, effects);
    }
  }
  node.view.usedSlots = static_cast<int>(node.liveRanks.size());
}

void PlannerCore::nodeHeartbeat(const std::shared_ptr<NodeLink>& link) {
  noteHeard(*link);
}

void PlannerCore::nodeDetached(const std::shared_ptr<NodeLink>& link) {
  loop_->post([this, link] {
    Node* node = nodeOfLink(link);
    if (!node) return;
    spdlog::warn("node {} detached; its ranks are lost unless it re-attaches within {} ms", node->view.nodeId,
                 options_.nodeTimeoutMs);
    setLink(*node, nullptr);
    node->view.connected = false;
    node->detachedSinceMs = clock_->steadyMs();
    for (auto it = logStreams_.begin(); it != logStreams_.end();) {
      if (it->second.waitingNodes.count(node->view.nodeId)) {
        it->second.sink->onEnd(unavailable("node {} went away while sending logs", node->view.nodeId));
        it = logStreams_.erase(it);
      } else {
        ++it;
      }
    }
  });
}

void PlannerCore::expireNodes() {
  const int64_t now = clock_->steadyMs();
  for (auto& [nodeId, node] : nodes_) {
    if (node.link && now - node.link->heardSteadyMs() > options_.nodeTimeoutMs) {
      spdlog::warn("node {} sent nothing for {} ms: dropping its stream", nodeId, now - node.link->heardSteadyMs());
      node.link->close(Status::ok());
      setLink(node, nullptr);
      node.view.connected = false;
      node.detachedSinceMs = now;
    }
    if (node.link || node.detachedSinceMs == 0 || now - node.detachedSinceMs < options_.nodeTimeoutMs) continue;
    if (node.liveRanks.empty()) continue;
    std::string why = fmt::format("node {} lost contact {} s ago", nodeId, (now - node.detachedSinceMs) / 1000);
    auto lost = node.liveRanks;
    node.liveRanks.clear();
    node.view.usedSlots = 0;
    for (const auto& [jobId, attempt, rank] : lost) {
      JobRecord* job = findJob(jobId);
      if (!job || job->attempt != attempt) continue;
      auto effects = JobLifecycle::markRankLost(*job, rank, why, clock_->nowMs());
      commit(*job, effects);
    }
  }
}

void PlannerCore::listNodes(std::function<void(std::vector<NodeView>)> done) {
  loop_->post([this, done = std::move(done)] {
    std::vector<NodeView> out;
    for (const auto& [id, node] : nodes_) {
      if (node.view.slots == 0 && !node.link) continue;  // known only from a recovered job
      out.push_back(viewOf(id));
    }
    done(std::move(out));
  });
}

void PlannerCore::snapshot(std::function<void(ClusterSnapshot)> done) {
  loop_->post([this, done = std::move(done)] {
    ClusterSnapshot out;
    for (const auto& [id, job] : jobs_) {
      out.jobsByTenant[job.tenant][job.state] += 1;
      out.restarts += job.restarts;
      out.preemptions += job.preemptions;
      if (hasLiveAttempt(job.state)) out.liveJobs.push_back(job);
    }
    for (const auto& [id, node] : nodes_) {
      if (node.view.slots == 0 && !node.link) continue;  // known only from a recovered job
      out.nodes.push_back(viewOf(id));
    }
    makeDurable();
    done(std::move(out));
  });
}

void PlannerCore::setPlacementObserver(std::function<void(double)> observer) {
  loop_->post([this, observer = std::move(observer)]() mutable { placementObserver_ = std::move(observer); });
}

NodeView PlannerCore::viewOf(const std::string& nodeId) const {
  NodeView view = nodes_.at(nodeId).view;
  if (const auto& link = nodes_.at(nodeId).link) view.lastSeenMs = link->heardWallMs();
  view.usedGpus = usedGpus(nodes_.at(nodeId));
  if (auto c = cordons_.find(nodeId); c != cordons_.end()) {
    view.cordoned = true;
    view.cordonReason = c->second.reason;
  }
  return view;
}

void PlannerCore::drainNode(const std::string& nodeId, std::string reason,
                            std::function<void(const StatusOr<NodeView>&)> done) {
  loop_->post([this, nodeId, reason = std::move(reason), done = std::move(done)] {
    auto it = nodes_.find(nodeId);
    if (it == nodes_.end() || (it->second.view.slots == 0 && !it->second.link))
      return done(notFound("node {} has never attached to this planner (`loomctl nodes` lists those that have)", nodeId));
    const std::string why = reason.empty() ? "drained" : "drained: " + reason;
    if (Status stored = store_->putCordon(nodeId, why, clock_->nowMs()); !stored.isOk())
      return done(stored.withContext("node " + nodeId));
    cordon(nodeId, Cordon{.reason = why, .stored = true});
    makeDurable();
    done(viewOf(nodeId));
  });
}

void PlannerCore::uncordonNode(const std::string& nodeId, std::function<void(const StatusOr<NodeView>&)> done) {
  loop_->post([this, nodeId, done = std::move(done)] {
    auto it = nodes_.find(nodeId);
    if (it == nodes_.end() && !cordons_.count(nodeId))
      return done(notFound("node {} has never attached to this planner (`loomctl nodes` lists those that have)", nodeId));
    if (Status removed = store_->deleteCordon(nodeId); !removed.isOk()) return done(removed.withContext("node " + nodeId));
    if (cordons_.erase(nodeId)) spdlog::info("node {} uncordoned: it takes ranks again", nodeId);
    schedule();
    makeDurable();
    if (it == nodes_.end()) return done(NodeView{.nodeId = nodeId});
    done(viewOf(nodeId));
  });
}

void PlannerCore::nodeDraining(const std::shared_ptr<NodeLink>& link) {
  loop_->post([this, link] {
    Node* node = nodeOfLink(link);
    if (!node) return;
    const std::string nodeId = node->view.nodeId;
    // An operator's drain stays as it was; this one lasts until the node's next daemon attaches.
    if (auto c = cordons_.find(nodeId); c != cordons_.end() && c->second.stored) {
      preemptJobsOn(nodeId, fmt::format("node {} {}; its loomd got SIGTERM", nodeId, c->second.reason));
      return;
    }
    cordon(nodeId, Cordon{.reason = "stopping: its loomd got SIGTERM", .stored = false});
  });
}

void PlannerCore::cordon(const std::string& nodeId, Cordon c) {
  spdlog::info("node {} cordoned: {}", nodeId, c.reason);
  const std::string why = fmt::format("node {} {}", nodeId, c.reason);
  cordons_[nodeId] = std::move(c);
  preemptJobsOn(nodeId, why);
}

void PlannerCore::preemptJobsOn(const std::string& nodeId, const std::string& why) {
  for (const std::string& id : jobOrder_) {
    JobRecord& job = jobs_.at(id);
    if (!hasLiveAttempt(job.state)) continue;
    const bool here = std::any_of(job.ranks.begin(), job.ranks.end(), [&](const RankStatus& r) {
      return r.nodeId == nodeId && (r.state == RankState::kLaunching || r.state == RankState::kRunning);
    });
    if (!here) continue;
    auto effects = JobLifecycle::preempt(job, why, clock_->nowMs());
    if (!effects.events.empty()) commit(job, effects);
  }
}

// ---- logs -------------------------------------------------------------------------------------

}  // namespace loom::planner
