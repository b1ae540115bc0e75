// loomctl nodes, drain and uncordon: the node daemons as the planner sees them.
#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "client/loom_client.h"
#include "client/loomctl/commands.h"

namespace loom::loomctl {

namespace {

void printNode(const GlobalOptions& g, const v1::Node& node) {
  if (g.format == OutputFormat::kJson) {
    std::puts(toJson(node).c_str());
  } else {
    std::printf("node %s: %s, %d of %d slots in use\n", node.node_id().c_str(),
                node.cordoned() ? ("cordoned (" + node.cordon_reason() + ")").c_str() : "takes ranks",
                node.used_slots(), node.slots());
  }
}

}  // namespace

int nodesCommand(const GlobalOptions& g) {
  client::LoomClient client(g.server, g.credentials);
  auto nodes = client.listNodes();
  if (!nodes.isOk()) return reportError(nodes.status());
  if (g.format == OutputFormat::kJson) {
    v1::ListNodesResponse response;
    for (const auto& n : *nodes) *response.add_nodes() = n;
    std::puts(toJson(response).c_str());
    return 0;
  }
  std::printf("%-20s %-16s %-10s %-8s %-9s %-20s %s\n", "NODE", "ADDRESS", "SLOTS", "GPUS", "STATE", "LAST SEEN",
              "CORDONED");
  for (const auto& n : *nodes) {
    std::printf("%-20s %-16s %-10s %-8s %-9s %-20s %s\n", n.node_id().c_str(), n.address().c_str(),
                fmt::format("{}/{}", n.used_slots(), n.slots()).c_str(),
                n.gpus() > 0 ? fmt::format("{}/{}", n.used_gpus(), n.gpus()).c_str() : "-",
                n.connected() ? "attached" : "lost",
                formatTime(n.last_seen_ms()).c_str(), n.cordoned() ? n.cordon_reason().c_str() : "-");
  }
  return 0;
}

int drainCommand(const GlobalOptions& g, const std::string& nodeId, const std::string& reason, double timeoutS) {
  client::LoomClient client(g.server, g.credentials);
  auto drained = client.drainNode(nodeId, reason);
  if (!drained.isOk()) return reportError(drained.status());
  if (g.format == OutputFormat::kHuman)
    std::printf("node %s cordoned; its ranks are preempted (SIGTERM: train jobs checkpoint, then relaunch "
                "elsewhere)\n", nodeId.c_str());
  // As kubectl drain: done once the node's ranks have ended.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000));
  v1::Node node = *drained;
  while (node.used_slots() > 0) {
    if (timeoutS > 0 && std::chrono::steady_clock::now() >= deadline)
      return reportError(Status(StatusCode::kDeadlineExceeded,
                                fmt::format("node {} still runs {} rank(s) after {:g} s; it stays cordoned", nodeId,
                                            node.used_slots(), timeoutS)));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto nodes = client.listNodes();
    if (!nodes.isOk()) return reportError(nodes.status());
    for (const auto& n : *nodes)
      if (n.node_id() == nodeId) node = n;
  }
  printNode(g, node);
  return 0;
}

int uncordonCommand(const GlobalOptions& g, const std::string& nodeId) {
  client::LoomClient client(g.server, g.credentials);
  auto node = client.uncordonNode(nodeId);
  if (!node.isOk()) return reportError(node.status());
  printNode(g, *node);
  return 0;
}

}  // namespace loom::loomctl
