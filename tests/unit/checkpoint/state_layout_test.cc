// The state layout against its promise: over every rank file of a layout, each element of each
// trained parameter's state is held once per copy the layout keeps (a data-parallel replica at
// stage 0, a tensor-parallel rank for a parameter it does not split), pieces lie inside their
// tensors without overlapping, and frozen parameters have no state.
#include "worker/checkpoint/state_layout.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "planner/optimizer_rules.h"
#include "tests/catch.h"
#include "worker/checkpoint/shard_layout.h"
#include "worker/convert/layout_plan.h"

namespace loom::checkpoint {
namespace {

planner::ModelConfig tinyLlama() {
  auto model = planner::parseModelConfig(R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})");
  REQUIRE(model.isOk());
  return *model;
}

planner::ModelConfig tinyMixtral() {
  auto model = planner::parseModelConfig(R"({"model_type": "mixtral", "vocab_size": 256, "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "num_local_experts": 4, "num_experts_per_tok": 2})");
  REQUIRE(model.isOk());
  return *model;
}

void checkLayout(int world, int stage, int tp, const std::string& optimizer, int ep = 1) {
  INFO("world " << world << ", ZeRO stage " << stage << ", tp " << tp << ", ep " << ep << ", " << optimizer);
  nlohmann::json ds{{"train_batch_size", 12},
                    {"optimizer", {{"type", optimizer}, {"params", {{"lr", 1e-3}}}}},
                    {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 100}}}};
  if (tp > 1) ds["tensor_parallel"] = {{"autotp_size", tp}};
  if (ep > 1) ds["expert_parallel"] = {{"enabled", true}, {"autoep_size", ep}};
  const std::vector<std::string> frozen{ep > 1 ? "model\\.layers\\.0\\.block_sparse_moe\\.experts\\.\\d+\\.w3\\.weight"
                                               : "model\\.layers\\.0\\.mlp\\.up_proj\\.weight"};
  auto compiled = convert::compileLayout(ep > 1 ? tinyMixtral() : tinyLlama(), ds, world, frozen, "test");
  INFO(compiled.status().toString());
  REQUIRE(compiled.isOk());
  const planner::Plan& plan = compiled->plan;
  auto layout = stateLayout(plan, compiled->deepspeed);
  REQUIRE(layout.isOk());
  CHECK(layout->files.size() == (stage == 0 && tp == 1 && ep == 1 ? 1u : static_cast<size_t>(world)));

  std::map<std::pair<int, std::string>, std::vector<int>> held;  // (parameter, state) -> count per element
  for (const StateFile& f : layout->files) {
    for (const StateTensor& t : f.tensors) {
      int64_t end = 0;
      for (const StatePiece& p : t.pieces) {
        CHECK(p.at >= end);  // in order, not overlapping
        end = p.at + p.length;
        CHECK(end <= t.numel());
        const planner::ParameterSpec& spec = plan.parameters[p.parameter];
        CHECK(p.offset + p.length <= spec.localNumel());
        auto& counts = held[{p.parameter, t.state}];
        counts.resize(spec.numel());
        for (const ElementRun& run : wholeRuns(shardLayout(spec, f.tpRank, tp), p.offset, p.length))
          for (int64_t e = 0; e < run.length; ++e) ++counts[run.whole + e];
      }
    }
  }
  const int dp = world / tp;
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const planner::ParameterSpec& spec = plan.parameters[i];
    std::vector<std::string> states{"master"};
    for (const auto& s : planner::optimizerRule(compiled->deepspeed.optimizer, spec.muon).stateNames) states.push_back(s);
    for (const std::string& state : states) {
      auto it = held.find({static_cast<int>(i), state});
      if (!spec.trainable || spec.frozen) {
        CHECK(it == held.end());
        continue;
      }
      if (state == "master" && layout->mastersAreWeights) continue;
      INFO(spec.name << " " << state);
      REQUIRE(it != held.end());
      // Whole on every rank of its data-parallel group (an expert's: the ranks holding it): stage 0
      // under tensor or expert parallelism (each rank's file holds its state), and stage 3's
      // persistent parameters.
      const bool everyReplica =
          (stage == 0 && (tp > 1 || ep > 1)) || (stage == 3 && (spec.persistent || spec.partitionNumel == 0));
      const int replicas = spec.expert >= 0 ? dp / ep : dp;
      const int copies = (everyReplica ? replicas : 1) * (spec.splitDim >= 0 ? spec.kvReplication : tp);
      CHECK(std::all_of(it->second.begin(), it->second.end(), [&](int n) { return n == copies; }));
    }
  }
}

TEST_CASE("state layouts: every element of every trained parameter's state held once per copy", "[checkpoint]") {
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {1, 3, 4}) checkLayout(world, stage, 1, "AdamW");
    checkLayout(4, stage, 2, "AdamW");
    checkLayout(4, stage, 4, "AdamW");  // more ranks than KV heads: each KV head on two
    checkLayout(4, stage, 2, "Muon");
    checkLayout(4, stage, 1, "AdamW", 2);  // each rank's file: the dense parameters and its own experts
    checkLayout(4, stage, 1, "AdamW", 4);
    checkLayout(4, stage, 2, "AdamW", 2);
  }
}

}  // namespace
}  // namespace loom::checkpoint
