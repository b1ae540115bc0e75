#include "planner/memory_estimate.h"

#include <cmath>

#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

namespace {

ModelConfig llama3_8b() {
  return *parseModelConfig(R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8})");
}

MemoryEstimate estimate(const ModelConfig& c, int tp, TrainingShape shape) {
  auto params = enumerateParameters(c);
  auto layouts = layoutTensorParallel(c, params, tp);
  REQUIRE(layouts.isOk());
  shape.tensorParallel = tp;
  return estimateMemory(c, params, *layouts, shape);
}

bool within(double value, double expected, double tolerance) { return std::abs(value / expected - 1) <= tolerance; }

}  // namespace

TEST_CASE("memory: ZeRO-3 mixed-precision Adam keeps about 16 N / dp bytes of model state", "[planner]") {
  const auto c = llama3_8b();
  const double n = 8'030'261'248.0;
  // 64 ranks, tp 8: dp 8. Small buckets, so the analytical figure dominates.
  auto m = estimate(c, 8, {.zeroStage = 3, .dataParallel = 8, .reduceBucketElements = 1'000'000,
                           .prefetchBucketElements = 1'000'000});
  const double perRank = n / 8 / 8;  // tp, then dp
  CHECK(within(m.parameters + m.gradients + m.optimizer, 16 * perRank, 0.10));
  CHECK(within(m.optimizer, 12 * perRank, 0.01));
}

TEST_CASE("memory: each ZeRO stage divides one more term by dp", "[planner]") {
  const auto c = llama3_8b();
  auto stage0 = estimate(c, 1, {.zeroStage = 0, .dataParallel = 4});
  auto stage1 = estimate(c, 1, {.zeroStage = 1, .dataParallel = 4});
  auto stage2 = estimate(c, 1, {.zeroStage = 2, .dataParallel = 4, .reduceBucketElements = 0});
  CHECK(within(stage1.optimizer, stage0.optimizer / 4.0, 0.001));
  CHECK(stage1.gradients == stage0.gradients);
  CHECK(within(stage2.gradients, stage0.gradients / 4.0, 0.001));
  auto offloaded = estimate(c, 1, {.zeroStage = 2, .dataParallel = 4, .offloadOptimizer = true});
  CHECK(offloaded.optimizer == 0);
  CHECK(offloaded.hostOptimizer == stage2.optimizer);
  // offload_param: stage 3's parts move to the host; the persistent parameters and the gathered
  // working set stay.
  auto stage3 = estimate(c, 1, {.zeroStage = 3, .dataParallel = 4});
  auto params = estimate(c, 1, {.zeroStage = 3, .dataParallel = 4, .offloadParameters = true});
  CHECK(params.hostParameters > 0);
  CHECK(params.parameters + params.hostParameters == stage3.parameters);
  CHECK(params.parameters < stage3.parameters / 2);
  CHECK(params.optimizer == stage3.optimizer);
}

TEST_CASE("memory: a job that does not fit says by how much and what dominates", "[planner]") {
  auto m = estimate(llama3_8b(), 1, {.zeroStage = 0, .dataParallel = 1});
  Status s = checkFits(m, int64_t(80) << 30);
  CHECK(s.code() == StatusCode::kInvalidArgument);  // the spec must change
  CHECK(s.message().find("above the device's 80.0 GiB; the largest term is optimizer state") != std::string::npos);
  CHECK(checkFits(m, int64_t(1) << 40).isOk());
}

TEST_CASE("memory: checkpointed layers keep their inputs, one layer's activations at a time", "[planner]") {
  const auto c = llama3_8b();
  const TrainingShape plain{.zeroStage = 3, .dataParallel = 8, .microBatch = 1, .sequenceLength = 8192};
  TrainingShape checkpointed = plain;
  checkpointed.checkpointedLayers = c.numLayers;
  TrainingShape onHost = checkpointed;
  onHost.checkpointsOnHost = true;
  TrainingShape half = plain;
  half.checkpointedLayers = c.numLayers / 2;
  const int64_t logits = 2 * 4 * 8192 * c.vocabSize;
  const int64_t perLayer = c.hiddenSize * 8192 * 34;  // 10 + 24 bytes per hidden unit and token
  CHECK(estimate(c, 1, plain).activations == perLayer * c.numLayers + logits);
  CHECK(estimate(c, 1, checkpointed).activations == c.numLayers * 2 * c.hiddenSize * 8192 + perLayer + logits);
  CHECK(estimate(c, 1, onHost).activations == perLayer + logits);
  CHECK(estimate(c, 1, half).activations ==
        perLayer * (c.numLayers / 2) + (c.numLayers / 2) * 2 * c.hiddenSize * 8192 + perLayer + logits);
}
