// PlannerCore's placement: what each node can take, tenants' usage against their quotas, the
// FIFO queue of pending jobs, gang placement and the launch orders (rank 0's node first; the rest
// once its master port is known). The jobs' side is planner_core.cc, the nodes' planner_core_nodes.cc.
#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "planner/planner_core.h"

namespace loom::planner {

int PlannerCore::usedGpus(const Node& node) const {
  int used = 0;
  for (const auto& [jobId, attempt, rank] : node.liveRanks) {
    auto job = jobs_.find(jobId);
    if (job != jobs_.end() && job->second.spec.device == DeviceKind::kCuda) ++used;
  }
  return used;
}

std::vector<NodeCapacity> PlannerCore::nodeCapacity(bool cuda) const {
  std::vector<NodeCapacity> capacity;
  for (const auto& [nodeId, node] : nodes_) {
    if (!node.link) continue;
    // A cordoned node still counts for what could fit (a job is not refused during a drain), not for placing.
    int free = cordons_.count(nodeId) ? 0 : node.view.slots - static_cast<int>(node.liveRanks.size());
    int total = node.view.slots;
    if (cuda && node.view.gpus > 0) {
      free = std::min(free, node.view.gpus - usedGpus(node));
      total = std::min(total, node.view.gpus);
    }
    capacity.push_back({.nodeId = nodeId, .freeSlots = free, .totalSlots = total});
  }
  return capacity;
}

std::map<std::string, TenantUsage> PlannerCore::tenantUsage() const {
  std::map<std::string, TenantUsage> usage;
  std::set<std::string> counted;
  for (const auto& [nodeId, node] : nodes_) {
    for (const auto& [jobId, attempt, rank] : node.liveRanks) {
      auto job = jobs_.find(jobId);
      if (job == jobs_.end() || job->second.tenant.empty()) continue;
      TenantUsage& held = usage[job->second.tenant];
      ++held.ranks;
      if (job->second.spec.device == DeviceKind::kCuda) ++held.gpus;
      if (counted.insert(jobId).second) ++held.runningJobs;
    }
  }
  return usage;
}

void PlannerCore::queueIfPending(const JobRecord& job) {
  if (job.state == JobState::kPending) placementQueue_.insert({creationIndex_.at(job.id), job.id});
}

void PlannerCore::schedule() {
  // The pending jobs, oldest first (FIFO), taken out of the queue as they leave PENDING: a pass
  // costs the pending jobs, not every job ever stored. A copy, as a commit below may schedule.
  std::vector<std::string> pending;
  for (auto it = placementQueue_.begin(); it != placementQueue_.end();) {
    if (jobs_.at(it->second).state != JobState::kPending) {
      waitingSinceMs_.erase(it->second);
      it = placementQueue_.erase(it);
    } else {
      pending.push_back((it++)->second);
    }
  }
  // What each tenant's jobs hold: counted once a pass, when a pending job has a quota.
  std::optional<std::map<std::string, TenantUsage>> usage;
  for (const auto& id : pending) {
    JobRecord& job = jobs_.at(id);
    if (job.state != JobState::kPending) continue;
    waitingSinceMs_.try_emplace(id, clock_->nowMs());
    auto quota = job.tenant.empty() ? options_.quotas.end() : options_.quotas.find(job.tenant);
    if (quota != options_.quotas.end()) {
      if (!usage) usage = tenantUsage();
      if (std::string wait = quotaWait(job.spec, job.tenant, quota->second, (*usage)[job.tenant]); !wait.empty()) {
        auto effects = JobLifecycle::markWaiting(job, wait, clock_->nowMs());
        if (!effects.events.empty()) commit(job, effects);
        continue;
      }
    }
    const bool cuda = job.spec.device == DeviceKind::kCuda;
    const std::vector<NodeCapacity> capacity = nodeCapacity(cuda);
    const bool countsGpus = cuda && std::any_of(nodes_.begin(), nodes_.end(),
                                                [](const auto& n) { return n.second.link && n.second.view.gpus > 0; });
    auto placement = placeGang(job.spec.ranks, capacity, nodeLocalGroup(job.spec.deepspeed),
                               countsGpus ? "GPU slot" : "slot");
    if (!placement.isOk()) {
      std::string reason = capacity.empty() ? "waiting for a node to attach" : placement.status().message();
      for (const NodeCapacity& node : capacity) {
        if (auto c = cordons_.find(node.nodeId); c != cordons_.end())
          reason += fmt::format("; node {} is cordoned ({})", node.nodeId, c->second.reason);
      }
      auto effects = JobLifecycle::markWaiting(job, reason, clock_->nowMs());
      if (!effects.events.empty()) commit(job, effects);
      continue;
    }
    launch(job, *placement);
    if (usage && !job.tenant.empty()) (*usage)[job.tenant].add(job.spec);
  }
}

void PlannerCore::launch(JobRecord& job, const Placement& placement) {
  if (auto waiting = waitingSinceMs_.find(job.id); waiting != waitingSinceMs_.end()) {
    if (placementObserver_) placementObserver_(static_cast<double>(clock_->nowMs() - waiting->second) / 1000);
    waitingSinceMs_.erase(waiting);
  }
  auto effects = JobLifecycle::markPlaced(job, placement, clock_->nowMs());
  PendingLaunch pending{.attempt = job.attempt, .orders = {}};
  // The ranks execute the Plan compiled on submit; they never compile it again.
  std::string plan;
  if (job.hasPlan) {
    auto bytes = store_->loadPlanBytes(job.id);
    if (bytes.isOk()) {
      plan = std::move(bytes).value();
    } else {
      spdlog::error("job {}: {}; its ranks will report the missing plan", job.id, bytes.status().toString());
    }
  }
  LaunchOrder first;
  int groupRank = 0;
  for (const auto& nodeRanks : placement) {
    Node& node = nodes_.at(nodeRanks.nodeId);
    LaunchOrder order{.jobId = job.id, .attempt = job.attempt, .specJson = job.specJson, .ranks = {},
                      .worldSize = job.spec.ranks, .localWorldSize = static_cast<int>(nodeRanks.ranks.size()),
                      .masterAddr = "", .masterPort = 0, .pickMasterPort = false,
                      .heartbeatTimeoutMs = job.spec.heartbeatTimeoutMs, .gracePeriodMs = job.spec.gracePeriodMs,
                      .groupRank = groupRank++, .plan = plan, .serviceToken = rankServices_.token(job.id, job.attempt)};
    for (size_t i = 0; i < nodeRanks.ranks.size(); ++i) {
      order.ranks.push_back({.rank = nodeRanks.ranks[i], .localRank = static_cast<int>(i)});
      node.liveRanks.insert({job.id, job.attempt, nodeRanks.ranks[i]});
    }
    node.view.usedSlots = static_cast<int>(node.liveRanks.size());
    bool holdsRankZero = !nodeRanks.ranks.empty() && nodeRanks.ranks.front() == 0;
    if (holdsRankZero) {
      if (job.spec.kind == JobKind::kRollout && job.spec.rollout.serve) {
        auto certificate = rankServices_.issue(job.id, job.attempt);
        if (certificate.isOk()) {
          order.serviceCertificate = std::move(certificate).value();
        } else {
          spdlog::error("job {}: no certificate for rank 0's service ({}): the planner cannot reach it",
                        job.id, certificate.status().toString());
        }
      }
      // torchrun compatibility: MASTER_ADDR/MASTER_PORT are rank 0's node and a port it picks
      // free; the other nodes launch once that port is known.
      order.pickMasterPort = true;
      order.masterAddr = node.view.address;
      first = order;
    } else {
      pending.orders.push_back(std::move(order));
    }
  }
  commit(job, effects);
  sendAfterCommit(nodes_.at(job.ranks[0].nodeId).link,
                  [first = std::move(first)](NodeLink& link) { link.launch(first); });
  if (!pending.orders.empty()) pendingLaunches_[job.id] = std::move(pending);
}

void PlannerCore::masterEndpointReported(const std::shared_ptr<NodeLink>& link, MasterEndpoint endpoint) {
  loop_->post([this, endpoint = std::move(endpoint)] {
    auto it = pendingLaunches_.find(endpoint.jobId);
    if (it == pendingLaunches_.end() || it->second.attempt != endpoint.attempt) return;
    for (auto& order : it->second.orders) {
      order.masterAddr = endpoint.address;
      order.masterPort = endpoint.port;
      JobRecord* job = findJob(order.jobId);
      const std::string& nodeId = job->ranks[order.ranks.front().rank].nodeId;
      auto node = nodes_.find(nodeId);
      if (node != nodes_.end() && node->second.link)
        sendAfterCommit(node->second.link, [order = std::move(order)](NodeLink& link) { link.launch(order); });
    }
    pendingLaunches_.erase(it);
  });
}

}  // namespace loom::planner
