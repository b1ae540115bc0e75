// loomctl plan: compiles a job's Plan here, with the planner's own code, and prints it.
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "client/loomctl/commands.h"
#include "common/human_bytes.h"
#include "planner/job_plan.h"
#include "proto/convert.h"

namespace loom::loomctl {

namespace {

using planner::Plan;

std::string withCommas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// "8-15", "5,13,..,61 (step 8)", or the ranks when few and irregular.
std::string groupText(const std::vector<int>& g) {
  if (g.size() == 1) return std::to_string(g[0]);
  const int step = g[1] - g[0];
  bool arithmetic = true;
  for (size_t i = 1; i < g.size(); ++i) arithmetic &= g[i] - g[i - 1] == step;
  if (arithmetic && step == 1) return fmt::format("{}-{}", g.front(), g.back());
  if (arithmetic && g.size() > 4) return fmt::format("{},{},..,{} (step {})", g[0], g[1], g.back(), step);
  if (g.size() <= 8) return fmt::format("{}", fmt::join(g, ","));
  return fmt::format("{},{},{},..,{}", g[0], g[1], g[2], g.back());
}

std::string groupsLine(const char* axis, const planner::RankGroups& groups) {
  std::string shown;
  const size_t n = groups.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 4 && i == 2) {
      shown += " ...";
      i = n - 2;
      continue;
    }
    shown += " [" + groupText(groups[i]) + "]";
  }
  return fmt::format("  {:<12} {:>5} of {:<5}{}\n", axis, n, groups.empty() ? 0 : groups[0].size(), shown);
}

std::string splitText(const planner::ParameterSpec& p) {
  if (p.split == planner::TpSplit::kReplicated) return "whole";
  return fmt::format("{} (dim {})", planner::tpSplitName(p.split), p.splitDim);
}

// The kind of layer a parameter is, for the table: its role, marked expert, shared or bias.
std::string kindOf(const planner::ParameterSpec& p) {
  std::string kind = planner::layerRoleName(p.role);
  if (p.expert >= 0) kind = "expert " + kind;
  if (p.name.find("shared_expert") != std::string::npos && p.role != planner::LayerRole::kSharedExpertGate)
    kind = "shared " + kind;
  if (p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0) kind += " bias";
  return kind;
}

std::string describeLayers(const Plan& plan) {
  struct Kind {
    const planner::ParameterSpec* example = nullptr;
    int count = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, Kind> kinds;
  std::map<int, bool> experts;
  for (const auto& p : plan.parameters) {
    const std::string kind = kindOf(p);
    auto& k = kinds[kind];
    if (!k.example) {
      k.example = &p;
      order.push_back(kind);
    }
    ++k.count;
    if (p.expert >= 0) experts[p.expert] = true;
  }
  std::string out = fmt::format("Layers (tensor parallel {}{}):\n", plan.mesh.tp,
                                plan.mesh.tp == 1 ? ": every parameter whole on its rank" : "");
  out += fmt::format("  {:<20} {:>6}  {:<14} {:<18} {:<18} {}\n", "KIND", "COUNT", "SPLIT", "SHAPE", "PER RANK", "NOTE");
  for (const auto& kind : order) {
    const auto& k = kinds[kind];
    const auto& p = *k.example;
    std::string note = p.layout;
    if (p.expert >= 0)
      note = fmt::format("{} of {} experts per rank (ep {})", experts.size() / plan.mesh.ep, experts.size(),
                         plan.mesh.ep);
    if (p.muon)  // the optimizer's rule for it (planner/optimizer_rules.h)
      note += (note.empty() ? "" : "; ") +
              (p.muonHeadDim > 0 ? fmt::format("Muon, head by head ({} rows each)", p.muonHeadDim) : std::string("Muon"));
    out += fmt::format("  {:<20} {:>6}  {:<14} {:<18} {:<18} {}\n", kind, k.count, splitText(p), shapeText(p.shape),
                       shapeText(p.localShape), note);
  }
  return out;
}

std::string describeZero(const Plan& plan) {
  const auto& z = plan.zero;
  std::string out = fmt::format("ZeRO stage {}", z.stage);
  if (z.stage == 0) return out + ": every rank keeps whole gradients and optimizer state\n";
  out += fmt::format(": dense parameters over {} ranks", z.denseGroupSize);
  if (plan.routing || plan.mesh.ep > 1) out += fmt::format(", expert parameters over {}", z.expertGroupSize);
  if (z.offloadOptimizer) out += "; optimizer state on the host";
  out += "\n";
  if (z.stage == 3) {
    int persistent = 0;
    for (const auto& p : plan.parameters) persistent += p.persistent;
    out += fmt::format("  each parameter cut into parts; {} of at most {} elements stay whole\n", persistent,
                       withCommas(z.persistenceThreshold));
  } else {
    int64_t padding = 0;
    for (const auto& b : z.buffers) padding += b.partition.padding;
    out += fmt::format("  {} flat buffers (one per block, experts apart), {} elements of padding\n", z.buffers.size(),
                       withCommas(padding));
  }
  out += fmt::format("  a rank keeps {} of the {} elements of its shard\n", withCommas(planner::keptElements(plan, 0)),
                     withCommas(planner::shardElements(plan, 0)));
  return out;
}

std::string describeMemory(const Plan& plan) {
  const auto& m = plan.memory;
  std::string out = "Memory per rank (every rank alike):\n";
  out += fmt::format("  {:<8} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "RANKS", "PARAMETERS", "GRADIENTS",
                     "OPTIMIZER", "ACTIVATIONS", "TOTAL", "DEVICE");
  out += fmt::format("  {:<8} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}\n", fmt::format("0-{}", plan.mesh.world - 1),
                     humanBytes(m.parameters), humanBytes(m.gradients), humanBytes(m.optimizer),
                     humanBytes(m.activations), humanBytes(m.total()),
                     plan.deviceMemoryBytes ? humanBytes(plan.deviceMemoryBytes) : "no limit");
  if (m.hostOptimizer) out += fmt::format("  and {} of optimizer state on the host\n", humanBytes(m.hostOptimizer));
  if (m.hostParameters) out += fmt::format("  and {} of parameters on the host\n", humanBytes(m.hostParameters));
  return out;
}

std::string describePlan(const Plan& plan) {
  const auto& mesh = plan.mesh;
  std::string out;
  out += fmt::format("Plan:      {} ({} job, {} with {} parameters)\n", plan.jobName,
                     plan.training ? "train" : "eval", plan.modelFamily, withCommas(plan.totalElements()));
  out += fmt::format("Mesh:      {} ranks = dp {} x sp {} x tp {}; experts over ep {}\n", mesh.world, mesh.dp, mesh.sp,
                     mesh.tp, mesh.ep);
  out += fmt::format("Batch:     micro-batch {} x {} tokens per rank, {}\n", plan.microBatch, plan.sequenceLength,
                     planner::precisionName(plan.precision));
  if (plan.routing) {
    const auto& r = *plan.routing;
    out += fmt::format("Routing:   AutoEP preset {}, {} scores, top {}{}, scale {}\n", r.preset,
                       r.scoring == planner::RouterConfig::Scoring::kSigmoid ? "sigmoid" : "softmax", r.topK,
                       r.normalizeTopK ? " renormalized" : "", r.routeScale * r.routedScalingFactor);
  }
  out += "Groups:    AXIS         COUNT of SIZE\n";
  out += groupsLine("tensor", plan.groups.tensor);
  out += groupsLine("sequence", plan.groups.sequence);
  out += groupsLine("data", plan.groups.data);
  out += groupsLine("dense data", plan.groups.denseData);
  out += groupsLine("expert", plan.groups.expert);
  out += groupsLine("expert data", plan.groups.expertData);
  out += describeLayers(plan);
  out += describeZero(plan);
  out += describeMemory(plan);
  return out;
}

}  // namespace

int planCommand(const GlobalOptions& g, const std::string& file, int world) {
  auto text = readSpecFile(file, g.overrides);
  if (!text.isOk()) return reportError(text.status());
  if (world > 0) {
    // As if the spec asked for `world` ranks: the batch triple and the mesh follow.
    auto root = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (root.is_object() && root.contains("resources") && root["resources"].is_object()) {
      root["resources"]["ranks"] = world;
      *text = root.dump();
    }
  }
  auto spec = planner::parseJobSpec(*text, planner::SpecPurpose::kPlan);
  if (!spec.isOk()) return reportError(spec.status().withContext(file));
  auto plan = planner::compileJobPlan(*spec, planner::SpecPurpose::kPlan);
  if (!plan.isOk()) return reportError(plan.status().withContext(file));
  if (g.format == OutputFormat::kJson) {
    std::puts(toJson(convert::toProto(*plan)).c_str());
  } else {
    std::fputs(describePlan(*plan).c_str(), stdout);
  }
  return 0;
}

}  // namespace loom::loomctl
