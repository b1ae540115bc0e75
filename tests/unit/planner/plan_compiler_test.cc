// Golden plans of four published models, checked against arithmetic done by hand (shown beside
// each expectation), and every reason a plan is refused.
#include "planner/plan_compiler.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;
using nlohmann::json;

namespace {

// The published config.json files live beside this test (tests/unit/planner/data/).
ModelConfig modelOf(const std::string& file) {
  const std::string path = std::string(LOOM_PLANNER_TEST_DATA) + "/" + file;
  auto text = files::readFile(path);
  REQUIRE(text.isOk());
  auto model = parseModelConfig(*text, path);
  INFO(model.status().toString());
  REQUIRE(model.isOk());
  return *model;
}

json deepspeed(const json& patch = json::object()) {
  json ds{{"train_micro_batch_size_per_gpu", 1},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
          {"bf16", {{"enabled", true}}}};
  ds.merge_patch(patch);
  return ds;
}

json trainSpec(int ranks, const json& ds, int64_t seqLen = 4096, const json& resources = json::object()) {
  json spec{{"name", "golden"},
            {"kind", "train"},
            {"resources", {{"ranks", ranks}, {"device", "cuda"}}},
            {"model", {{"config", "/models/config.json"}}},
            {"data", {{"train", "/data/train.tokens"}, {"seq_len", seqLen}}},
            {"train", {{"steps", 10}}},
            {"deepspeed", ds}};
  spec["resources"].merge_patch(resources);
  return spec;
}

// Parses the spec as `loomctl plan` does and compiles it: the status of whichever step refused.
StatusOr<Plan> compile(const std::string& configFile, const json& spec) {
  auto parsed = parseJobSpec(spec.dump(), SpecPurpose::kPlan);
  if (!parsed.isOk()) return parsed.status();
  return compilePlan(modelOf(configFile), *parsed);
}

Plan compiled(const std::string& configFile, const json& spec) {
  auto plan = compile(configFile, spec);
  INFO(plan.status().toString());
  REQUIRE(plan.isOk());
  return std::move(plan).value();
}

std::string rejection(const std::string& configFile, const json& spec) {
  auto plan = compile(configFile, spec);
  REQUIRE_FALSE(plan.isOk());
  CHECK(plan.status().code() == StatusCode::kInvalidArgument);
  return plan.status().message();
}

const ParameterSpec& parameter(const Plan& plan, const std::string& name) {
  for (const auto& p : plan.parameters) {
    if (p.name == name) return p;
  }
  FAIL("no parameter " << name);
  return plan.parameters.front();
}

using Shape = std::vector<int64_t>;
using Ranks = std::vector<int>;

}  // namespace

TEST_CASE("golden: Llama-3-8B on 64 ranks - tp 8 - ZeRO 3", "[planner][plan]") {
  const Plan plan = compiled("llama3_8b.json", trainSpec(64, deepspeed({{"tensor_parallel", {{"autotp_size", 8}}},
                                                                         {"zero_optimization", {{"stage", 3}}}}),
                                                         8192));
  // 64 = dp 8 x sp 1 x tp 8.
  CHECK((plan.mesh.world == 64 && plan.mesh.dp == 8 && plan.mesh.sp == 1 && plan.mesh.tp == 8 && plan.mesh.ep == 1));
  CHECK(plan.modelFamily == "llama");
  CHECK(checkPlanRunnable(plan).isOk());  // AutoTP's default layout: the workers run it
  CHECK(plan.totalElements() == 8'030'261'248);

  // Groups: tp varies fastest, so a tensor-parallel group is 8 consecutive ranks (one node).
  REQUIRE(plan.groups.tensor.size() == 8);
  CHECK(plan.groups.tensor[1] == Ranks{8, 9, 10, 11, 12, 13, 14, 15});
  REQUIRE(plan.groups.data.size() == 8);
  CHECK(plan.groups.data[5] == Ranks{5, 13, 21, 29, 37, 45, 53, 61});  // rank 13's: every 8th rank from 5
  CHECK(plan.groups.denseData == plan.groups.data);                      // sp 1
  CHECK(plan.groups.sequence.size() == 64);                              // 64 groups of one
  CHECK(plan.groups.expertData == plan.groups.data);                     // ep 1: no experts anyway

  // AutoTP: q 32 heads / 8 = 4 heads of 128 = 512 rows; k, v 8 KV heads / 8 = 1 head = 128 rows;
  // o by columns; gate/up 14336 / 8 = 1792 rows, down 1792 columns; embedding and head
  // 128256 / 8 = 16032 rows; norms whole.
  const std::string l = "model.layers.7.";
  CHECK(parameter(plan, l + "self_attn.q_proj.weight").localShape == Shape{512, 4096});
  const auto& k = parameter(plan, l + "self_attn.k_proj.weight");
  CHECK((k.split == TpSplit::kColumn && k.splitDim == 0 && k.localShape == Shape{128, 4096} && k.kvReplication == 1));
  CHECK(k.layout == "GQA: 1 of 8 KV heads per rank, with their query heads");
  const auto& o = parameter(plan, l + "self_attn.o_proj.weight");
  CHECK((o.split == TpSplit::kRow && o.splitDim == 1 && o.localShape == Shape{4096, 512}));
  CHECK(parameter(plan, l + "mlp.up_proj.weight").localShape == Shape{1792, 4096});
  CHECK(parameter(plan, l + "mlp.down_proj.weight").localShape == Shape{4096, 1792});
  const auto& embed = parameter(plan, "model.embed_tokens.weight");
  CHECK((embed.split == TpSplit::kVocab && embed.localShape == Shape{16032, 4096} && embed.tiedTo.empty()));
  CHECK(embed.layout == "vocabulary-parallel: 16032 of 128256 rows per rank");
  CHECK(parameter(plan, "lm_head.weight").localShape == Shape{16032, 4096});
  const auto& norm = parameter(plan, l + "input_layernorm.weight");
  CHECK((norm.split == TpSplit::kReplicated && norm.splitDim == -1 && norm.localShape == Shape{4096}));
  CHECK(norm.dtype == "bfloat16");

  // A rank's shard: per layer q 2,097,152 + k, v 524,288 each + o 2,097,152 + gate/up/down
  // 3 x 7,340,032 + norms 8,192 = 27,271,168; x 32 layers = 872,677,376; plus embedding and head
  // 2 x 65,667,072 and the final norm 4,096 = 1,004,015,616. Equivalently: the 266,240 whole
  // elements (norms) + the other 8,029,995,008 / 8.
  for (int rank : {0, 13, 63}) CHECK(shardElements(plan, rank) == 1'004'015'616);

  // ZeRO 3 over the 8 data-parallel ranks: each split parameter in 8 parts (q: 2,097,152 / 8 =
  // 262,144; embedding: 65,667,072 / 8 = 8,208,384); the norms (4,096 elements, at most
  // stage3_param_persistence_threshold 1e5) stay whole. Kept: 1,003,749,376 / 8 + 266,240 =
  // 125,734,912 elements.
  CHECK(plan.zero.stage == 3);
  CHECK(plan.zero.denseGroupSize == 8);
  CHECK(plan.zero.buffers.empty());
  CHECK(parameter(plan, l + "self_attn.q_proj.weight").partitionNumel == 262'144);
  CHECK(parameter(plan, "model.embed_tokens.weight").partitionNumel == 8'208'384);
  CHECK(parameter(plan, l + "post_attention_layernorm.weight").persistent);
  CHECK(keptElements(plan, 13) == 125'734'912);

  // Memory: mixed-precision AdamW keeps 12 bytes of optimizer state per element of its partition.
  CHECK(plan.memory.optimizer == int64_t{12} * (1'004'015'616 / 8));
  CHECK(plan.memory.total() < plan.deviceMemoryBytes);  // 80 GiB, the cuda default
  CHECK(plan.deviceMemoryBytes == int64_t(80) << 30);
}

TEST_CASE("golden: Mixtral-8x7B on 16 ranks - ep 8 - tp 2 - ZeRO 2", "[planner][plan]") {
  const Plan plan = compiled(
      "mixtral_8x7b.json",
      trainSpec(16, deepspeed({{"tensor_parallel", {{"autotp_size", 2}}},
                               {"expert_parallel", {{"enabled", true}, {"autoep_size", 8}, {"preset_model", "mixtral"}}},
                               {"zero_optimization", {{"stage", 2}}}})));
  // 16 = dp 8 x tp 2; the 8 dense-data ranks of each tensor index form one expert-parallel group,
  // so each expert-data-parallel group is a single rank.
  CHECK((plan.mesh.dp == 8 && plan.mesh.tp == 2 && plan.mesh.ep == 8 && plan.mesh.expertData() == 1));
  CHECK(plan.totalElements() == 46'702'792'704);
  CHECK(plan.groups.denseData[1] == Ranks{1, 3, 5, 7, 9, 11, 13, 15});
  CHECK(plan.groups.expert == plan.groups.denseData);
  CHECK(plan.groups.expertData.size() == 16);
  REQUIRE(plan.routing.has_value());
  CHECK((plan.routing->preset == "mixtral" && plan.routing->topK == 2 && plan.routing->normalizeTopK));

  // Expert e of 8 lives on expert index e (8 / ep 8 = 1 expert per rank); rank 5 has expert index
  // (5 / tp 2) % 8 = 2.
  CHECK(parameter(plan, "model.layers.0.block_sparse_moe.experts.2.w1.weight").expertOwner == 2);
  const auto& w1 = parameter(plan, "model.layers.0.block_sparse_moe.experts.2.w1.weight");
  CHECK((w1.split == TpSplit::kColumn && w1.localShape == Shape{7168, 4096} && w1.layout.empty()));
  CHECK(parameter(plan, "model.layers.0.block_sparse_moe.experts.2.w2.weight").localShape == Shape{4096, 7168});
  CHECK(parameter(plan, "model.layers.0.block_sparse_moe.gate.weight").split == TpSplit::kReplicated);

  // A rank's shard, per layer: attention 8,388,608 (q) + 2 x 2,097,152 (k, v) + 8,388,608 (o) =
  // 20,971,520; norms 8,192 and router 8 x 4,096 = 32,768, whole; its one expert 3 x 7,168 x 4,096
  // = 88,080,384. 109,092,864 x 32 layers = 3,490,971,648, plus embedding and head 2 x 16,000 x
  // 4,096 = 131,072,000 and the final norm 4,096: 3,622,047,744.
  for (int rank : {0, 5, 15}) CHECK(shardElements(plan, rank) == 3'622'047'744);
  int held = 0;
  for (int i : parametersOfRank(plan, 5)) held += plan.parameters[i].expert == 2;
  CHECK(held == 32 * 3);  // only expert 2's w1, w2, w3 of each layer

  // ZeRO 2: layer 0's dense parameters (norms, q, k, v, o, router: 21,012,480 elements) in one
  // buffer over the 8 dense-data ranks, a multiple of 2 x 8 already: 2,626,560 per rank. Rank 3's
  // part, [7,879,680, 10,506,240), holds q's last 513,024 elements (q spans [4,096, 8,392,704)),
  // all of k, and v's first 16,384.
  CHECK(plan.zero.stage == 2);
  const FlatBufferSpec* dense = nullptr;
  const FlatBufferSpec* experts = nullptr;
  for (const auto& b : plan.zero.buffers) {
    if (b.block == 1) (b.experts ? experts : dense) = &b;
  }
  REQUIRE(dense != nullptr);
  REQUIRE(experts != nullptr);
  CHECK(dense->groupSize == 8);
  CHECK(dense->members.size() == 1);
  CHECK(dense->members[0].size() == 7);
  CHECK((dense->partition.flatNumel == 21'012'480 && dense->partition.padding == 0));
  CHECK(dense->partition.partitionNumel == 2'626'560);
  const auto& rank3 = dense->partition.fragments[3];
  REQUIRE(rank3.size() == 3);
  auto nameOf = [&](const ZeroFragment& f) { return plan.parameters[dense->members[0][f.parameter]].name; };
  CHECK(nameOf(rank3[0]) == "model.layers.0.self_attn.q_proj.weight");
  CHECK((rank3[0].parameterOffset == 7'875'584 && rank3[0].length == 513'024 && rank3[0].partitionOffset == 0));
  CHECK(nameOf(rank3[1]) == "model.layers.0.self_attn.k_proj.weight");
  CHECK(rank3[1].length == 2'097'152);
  CHECK(nameOf(rank3[2]) == "model.layers.0.self_attn.v_proj.weight");
  CHECK((rank3[2].parameterOffset == 0 && rank3[2].length == 16'384));
  // Its experts' buffer: one list per expert index, each one expert (3 x 29,360,128 elements),
  // over an expert-data-parallel group of one rank: whole.
  CHECK((experts->groupSize == 1 && experts->members.size() == 8));
  CHECK(plan.parameters[experts->members[2][0]].name == "model.layers.0.block_sparse_moe.experts.2.w1.weight");
  CHECK((experts->partition.flatNumel == 88'080'384 && experts->partition.partitionNumel == 88'080'384));

  // Optimizer state: 12 bytes for each element of the rank's dense partition (the 803,475,456
  // dense elements of its shard / 8) and of its whole expert (edp 1: 32 x 88,080,384).
  CHECK(plan.memory.optimizer == int64_t{12} * (803'475'456 / 8 + int64_t{32} * 88'080'384));
}

TEST_CASE("golden: Qwen3-30B-A3B on 32 ranks - Ulysses sp 4 - ep 8 - ZeRO 3", "[planner][plan]") {
  const Plan plan = compiled("qwen3_30b_a3b.json",
                             trainSpec(32, deepspeed({{"sequence_parallel_size", 4},
                                                      {"expert_parallel", {{"enabled", true}, {"autoep_size", 8}}},
                                                      {"zero_optimization", {{"stage", 3}}}}),
                                       16384));
  // 32 = dp 8 x sp 4; the experts are split over runs of 8 of the 32 dense-data ranks, so each
  // expert parameter is data-parallel over 32 / 8 = 4 ranks.
  CHECK((plan.mesh.dp == 8 && plan.mesh.sp == 4 && plan.mesh.tp == 1 && plan.mesh.ep == 8));
  CHECK(plan.mesh.expertData() == 4);
  CHECK(plan.totalElements() == 30'532'122'624);
  CHECK(plan.groups.sequence[3] == Ranks{12, 13, 14, 15});
  CHECK(plan.groups.data[1] == Ranks{1, 5, 9, 13, 17, 21, 25, 29});  // rank 13's: sequence index 1
  CHECK(plan.groups.denseData.size() == 1);                          // all 32
  CHECK(plan.groups.expert[1] == Ranks{8, 9, 10, 11, 12, 13, 14, 15});
  CHECK(plan.groups.expertData[5] == Ranks{5, 13, 21, 29});
  // The preset from the model (qwen3_moe), its routing from config.json: top 8, renormalized.
  REQUIRE(plan.routing.has_value());
  CHECK((plan.routing->preset == "qwen3_moe" && plan.routing->topK == 8 && plan.routing->normalizeTopK));

  // 128 experts / 8 = 16 per rank: rank 13 (index 13 % 8 = 5) holds experts 80 to 95.
  CHECK(parameter(plan, "model.layers.0.mlp.experts.80.up_proj.weight").expertOwner == 5);
  CHECK(parameter(plan, "model.layers.0.mlp.experts.95.up_proj.weight").expertOwner == 5);
  CHECK(parameter(plan, "model.layers.0.mlp.experts.96.up_proj.weight").expertOwner == 6);

  // Shard (no tensor parallelism): per layer attention 8,388,608 + 2 x 1,048,576 + 8,388,608 =
  // 18,874,368, q/k norms 256, layer norms 4,096, router 128 x 2,048 = 262,144: 19,140,864 dense;
  // 16 experts x 3 x 768 x 2,048 = 75,497,472. 94,638,336 x 48 = 4,542,640,128, plus embedding and
  // head 2 x 151,936 x 2,048 = 622,329,856 and the norm 2,048: 5,164,972,032.
  for (int rank : {0, 13}) CHECK(shardElements(plan, rank) == 5'164'972'032);

  // ZeRO 3: dense parameters over the 32 dense-data ranks (q: 8,388,608 / 32 = 262,144; router
  // 262,144 / 32 = 8,192), experts over their 4 expert-data ranks (768 x 2,048 / 4 = 393,216);
  // norms whole. Kept: dense (1,541,093,376 - 210,944 whole) / 32 + 210,944 = 48,363,520, experts
  // 48 x 75,497,472 / 4 = 905,969,664; 954,333,184 in all.
  CHECK(parameter(plan, "model.layers.0.self_attn.q_proj.weight").partitionNumel == 262'144);
  CHECK(parameter(plan, "model.layers.0.mlp.gate.weight").partitionNumel == 8'192);
  CHECK(parameter(plan, "model.layers.0.mlp.experts.7.down_proj.weight").partitionNumel == 393'216);
  CHECK(parameter(plan, "model.layers.0.self_attn.k_norm.weight").persistent);
  CHECK(keptElements(plan, 13) == 954'333'184);
  CHECK(plan.memory.optimizer == int64_t{12} * (1'541'093'376 / 32 + 905'969'664));
}

TEST_CASE("golden: DeepSeek-V3 on 256 ranks - ep 64 - ZeRO 3 - 141 GiB devices", "[planner][plan]") {
  const Plan plan = compiled("deepseek_v3.json",
                             trainSpec(256,
                                       deepspeed({{"expert_parallel", {{"enabled", true}, {"autoep_size", 64}}},
                                                  {"zero_optimization", {{"stage", 3}}}}),
                                       2048, {{"device_memory_gb", 141}}));
  // 256 = dp 256; ep 64 takes runs of 64 ranks, so each expert is data-parallel over 256 / 64 = 4.
  CHECK((plan.mesh.dp == 256 && plan.mesh.ep == 64 && plan.mesh.expertData() == 4));
  CHECK(plan.totalElements() == 671'026'419'200);
  CHECK(plan.groups.expert.size() == 4);
  CHECK(plan.groups.expert[1].front() == 64);
  CHECK(plan.groups.expertData[6] == Ranks{6, 70, 134, 198});
  // Routing from config.json: sigmoid scores, top 8 of 8 groups limited to 4, scaled by 2.5.
  REQUIRE(plan.routing.has_value());
  CHECK(plan.routing->scoring == RouterConfig::Scoring::kSigmoid);
  CHECK((plan.routing->groups == 8 && plan.routing->groupsPerToken == 4 && plan.routing->routedScalingFactor == 2.5));
  CHECK(plan.routing->sharedExperts);

  // 256 experts / 64 = 4 per rank: rank 70 (index 70 % 64 = 6) holds experts 24 to 27.
  CHECK(parameter(plan, "model.layers.3.mlp.experts.24.gate_proj.weight").expertOwner == 6);
  CHECK(parameter(plan, "model.layers.60.mlp.experts.27.down_proj.weight").expertOwner == 6);
  // The router's correction bias is a buffer: fp32, whole, never partitioned.
  const auto& bias = parameter(plan, "model.layers.3.mlp.gate.e_score_correction_bias");
  CHECK((!bias.trainable && bias.dtype == "float32" && !bias.persistent && bias.partitionNumel == 0));

  // Shard: 3 dense layers x 583,483,392 = 1,750,450,176; 58 MoE layers x (attention and norms
  // 187,121,664 + router 1,835,008 + bias 256 + shared experts 44,040,192) = 13,513,832,960; 58 x 4
  // experts x 44,040,192 = 10,217,324,544; embedding, head and norm 1,853,365,248: 27,334,972,928.
  CHECK(shardElements(plan, 70) == 27'334'972'928);
  // ZeRO 3: the 17,117,648,384 dense elements but the norms (61 x 16,384 + 7,168 = 1,006,592,
  // persistent) and buffers (58 x 256 = 14,848) over 256 ranks = 66,861,824; experts
  // 10,217,324,544 / 4 = 2,554,331,136; kept 66,861,824 + 1,006,592 + 14,848 + 2,554,331,136.
  CHECK(parameter(plan, "model.layers.3.mlp.experts.24.gate_proj.weight").partitionNumel == 2048 * 7168 / 4);
  CHECK(parameter(plan, "model.layers.3.self_attn.kv_a_layernorm.weight").persistent);
  CHECK(keptElements(plan, 70) == 2'622'214'400);
  // Optimizer state: 12 bytes per trainable element of the partitions, ceil((17,117,648,384 -
  // 14,848) / 256) = 66,865,756 dense and 2,554,331,136 expert.
  CHECK(plan.memory.optimizer == int64_t{12} * (66'865'756 + 2'554'331'136));
  CHECK(plan.memory.total() < plan.deviceMemoryBytes);
}

TEST_CASE("golden: Llama-3-70B on 1,024 ranks - tp 8 - ZeRO 3 (the benchmark's job)", "[planner][plan]") {
  const Plan plan = compiled("llama3_70b.json", trainSpec(1024, deepspeed({{"tensor_parallel", {{"autotp_size", 8}}},
                                                                           {"zero_optimization", {{"stage", 3}}}})));
  CHECK(plan.totalElements() == 70'553'706'496);
  CHECK((plan.mesh.dp == 128 && plan.groups.tensor.size() == 128 && plan.groups.data.size() == 8));
  CHECK(plan.groups.data[3].size() == 128);
  // Whole: 80 x 2 x 8,192 + 8,192 = 1,318,912 norm elements; the other 70,552,387,584 / tp 8 =
  // 8,819,048,448, of which ZeRO 3 keeps 1 / 128 on a rank: 68,898,816.
  CHECK(shardElements(plan, 1000) == 8'819'048'448 + 1'318'912);
  CHECK(keptElements(plan, 1000) == 68'898'816 + 1'318'912);
}

TEST_CASE("memory: ZeRO-3 mixed-precision Adam is within 10% of 16 N / (tp x dp) per rank", "[planner][plan]") {
  // Small buckets, so that the model states (2 + 2 + 12 bytes per element) are what is left.
  const Plan plan = compiled(
      "llama3_8b.json",
      trainSpec(64, deepspeed({{"tensor_parallel", {{"autotp_size", 8}}},
                               {"zero_optimization",
                                {{"stage", 3}, {"reduce_bucket_size", 1e6}, {"stage3_prefetch_bucket_size", 1e6}}}})));
  const double n = 8'030'261'248.0, analytical = 16 * n / (8 * 8);
  const double states = static_cast<double>(plan.memory.parameters + plan.memory.gradients + plan.memory.optimizer);
  CHECK(std::abs(states / analytical - 1) <= 0.10);
}

TEST_CASE("plan: zero_optimization's \"auto\" sizes come from the model's hidden_size", "[planner][plan]") {
  // Llama-3-8B: hidden_size 4096. Its norms (4096 elements) stay whole on every rank under the
  // HF Trainer's threshold (10 x 4096); nothing larger does.
  const Plan plan = compiled("llama3_8b.json",
                             trainSpec(8, deepspeed({{"zero_optimization",
                                                      {{"stage", 3},
                                                       {"reduce_bucket_size", "auto"},
                                                       {"stage3_prefetch_bucket_size", "auto"},
                                                       {"stage3_param_persistence_threshold", "auto"}}}})));
  CHECK(plan.zero.persistenceThreshold == 40'960);
  for (const ParameterSpec& p : plan.parameters) {
    INFO(p.name);
    CHECK(p.persistent == (p.localNumel() <= 40'960));
  }
}

TEST_CASE("plan: tied embeddings - GQA replication - eval jobs - cpu has no memory limit", "[planner][plan]") {
  // Llama-3.2-1B: tied embeddings; 8 KV heads over tp 16 puts each KV head on 2 ranks.
  auto model = *parseModelConfig(R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "tie_word_embeddings": true})");
  json spec = trainSpec(16, deepspeed({{"tensor_parallel", {{"autotp_size", 16}}}}), 2048, {{"device", "cpu"}});
  spec["kind"] = "eval";
  spec.erase("train");
  spec["data"] = {{"eval", "/data/eval.tokens"}, {"seq_len", 2048}};
  auto parsed = parseJobSpec(spec.dump(), SpecPurpose::kPlan);
  INFO(parsed.status().toString());
  REQUIRE(parsed.isOk());
  auto plan = compilePlan(model, *parsed);
  INFO(plan.status().toString());
  REQUIRE(plan.isOk());
  const auto& embed = parameter(*plan, "model.embed_tokens.weight");
  CHECK(embed.tiedTo == "lm_head.weight");
  CHECK(embed.layout == "vocabulary-parallel: 8016 of 128256 rows per rank; tied: also the LM head");
  const auto& v = parameter(*plan, "model.layers.0.self_attn.v_proj.weight");
  CHECK((v.kvReplication == 2 && v.localShape == Shape{64, 2048}));
  CHECK(v.layout == "GQA: 8 KV heads over 16 ranks, each on 2 ranks");
  CHECK(!plan->training);
  CHECK((plan->memory.gradients == 0 && plan->memory.optimizer == 0));
  CHECK(plan->deviceMemoryBytes == 0);
  // A probe job has no plan.
  JobSpec probe;
  CHECK(compilePlan(model, probe).status().message() == "kind: a probe job has no plan (train, eval and rollout jobs do)");
}

TEST_CASE("plan: layer_specs choose splits - strict mode names what nothing covers", "[planner][plan]") {
  json specs = {{"autotp_size", 8},
                {"partition_config",
                 {{"use_default_specs", false},
                  {"strict_mode", true},
                  {"layer_specs",
                   {{{"patterns", {".*\\.o_proj\\.weight$", ".*\\.down_proj\\.weight$"}}, {"partition_type", "row"}},
                    {{"patterns", {".*\\.[qkv]_proj\\.weight$", ".*\\.(gate|up)_proj\\.weight$"}},
                     {"partition_type", "column"}},
                    {{"patterns", {".*lm_head\\.weight$"}}, {"partition_type", "column"}, {"gather_output", true}},
                    {{"patterns", {"model\\.embed_tokens\\."}}, {"partition_type", "skip"}}}}}}};
  const Plan plan = compiled("llama3_8b.json", trainSpec(8, deepspeed({{"tensor_parallel", specs}})));
  const auto& head = parameter(plan, "lm_head.weight");
  CHECK((head.split == TpSplit::kColumn && head.gatherOutput && head.localShape == Shape{16032, 4096}));
  CHECK(parameter(plan, "model.embed_tokens.weight").split == TpSplit::kReplicated);
  CHECK(parameter(plan, "model.layers.0.mlp.down_proj.weight").split == TpSplit::kRow);
  // Planned, but not the layout the workers run: the gathered head is named with both layouts.
  CHECK(checkPlanRunnable(plan).message() ==
        "deepspeed.tensor_parallel.partition_config.layer_specs: model.embed_tokens.weight is laid out replicated "
        "(dimension -1); the workers run a llama decoder's embed vocab (dimension 0), AutoTP's default layout: a layer "
        "spec that changes it is planned (loomctl plan) but not run");

  json missing = specs;
  missing["partition_config"]["layer_specs"].erase(2);  // nothing covers lm_head any more
  CHECK(rejection("llama3_8b.json", trainSpec(8, deepspeed({{"tensor_parallel", missing}}))) ==
        "deepspeed.tensor_parallel.partition_config.strict_mode: lm_head.weight matches no layer_specs pattern");

  // A packed parameter: gate and up as two sub-parameters of 7,168 rows (as if fused), each split.
  json packed = {{"autotp_size", 8},
                 {"partition_config",
                  {{"layer_specs",
                    {{{"patterns", {".*\\.gate_proj\\.weight$"}}, {"partition_type", "column"}, {"shape", {2, -1}}}}}}}};
  const Plan packedPlan = compiled("llama3_8b.json", trainSpec(8, deepspeed({{"tensor_parallel", packed}})));
  CHECK(parameter(packedPlan, "model.layers.0.mlp.gate_proj.weight").subParams == Shape{896, 896});
  CHECK(checkPlanRunnable(packedPlan).message().find("gate_proj.weight is laid out column (dimension 0, packed "
                                                     "sub-parameters)") != std::string::npos);
  packed["partition_config"]["layer_specs"][0]["shape"] = {{4096, 10000}, 4096};
  CHECK(rejection("llama3_8b.json", trainSpec(8, deepspeed({{"tensor_parallel", packed}}))) ==
        "deepspeed.tensor_parallel.partition_config.layer_specs[0].shape: the sub-parameters of dimension 0 add up to "
        "14096, but model.layers.0.mlp.gate_proj.weight has 14336");
}

TEST_CASE("plan rejections: each names its reason", "[planner][plan]") {
  const auto tp = [](int n) { return json{{"tensor_parallel", {{"autotp_size", n}}}}; };
  // world != dp x sp x tp
  CHECK(rejection("llama3_8b.json", trainSpec(12, deepspeed(tp(8)))) ==
        "resources.ranks 12 cannot be split into deepspeed.tensor_parallel.autotp_size 8 x "
        "deepspeed.sequence_parallel_size 1: 12 is not a multiple of 8");
  // heads % tp
  CHECK(rejection("llama3_8b.json", trainSpec(6, deepspeed(tp(3)))) ==
        "tensor parallel 3: num_attention_heads 32 is not a multiple of it");
  // vocab % tp (a vocabulary of 128,257)
  {
    auto model = modelOf("llama3_8b.json");
    model.vocabSize = 128257;
    auto spec = parseJobSpec(trainSpec(2, deepspeed(tp(2))).dump(), SpecPurpose::kPlan);
    REQUIRE(spec.isOk());
    CHECK(compilePlan(model, *spec).status().message() ==
          "tensor parallel 2: vocab_size 128257 is not a multiple of it (the embedding and head are split by "
          "vocabulary)");
  }
  // KV heads against tp: 6 KV heads cannot line up with 4 ranks.
  {
    auto model = *parseModelConfig(R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 6144,
      "intermediate_size": 16384, "num_hidden_layers": 2, "num_attention_heads": 48, "num_key_value_heads": 6})");
    auto spec = parseJobSpec(trainSpec(4, deepspeed(tp(4))).dump(), SpecPurpose::kPlan);
    REQUIRE(spec.isOk());
    CHECK(compilePlan(model, *spec).status().message() ==
          "tensor parallel 4: num_key_value_heads 6 neither divides it nor is divided by it, so the KV heads cannot "
          "be aligned with the query heads");
  }
  const auto sp = [](int n) { return json{{"sequence_parallel_size", n}}; };
  // seq % sp
  CHECK(rejection("llama3_8b.json", trainSpec(4, deepspeed(sp(4)), 8190)) ==
        "sequence_parallel_size 4: the sequence length 8190 is not a multiple of it");
  // heads % sp: 32 heads over 64 sequence ranks
  CHECK(rejection("llama3_8b.json", trainSpec(64, deepspeed(sp(64)), 8192)) ==
        "sequence_parallel_size 64: num_attention_heads 32 is not a multiple of it");
  // KV heads against sp: Qwen3-30B-A3B's 4 KV heads and sp 8 work (each copied to 2 ranks); 6 of
  // 24 do not split into 4... and 4 is no multiple of 6.
  CHECK(compile("qwen3_30b_a3b.json", trainSpec(8, deepspeed(sp(8)), 4096, {{"device", "cpu"}})).isOk());
  {
    auto model = *parseModelConfig(R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 3072,
      "intermediate_size": 8192, "num_hidden_layers": 2, "num_attention_heads": 24, "num_key_value_heads": 6})");
    auto spec = parseJobSpec(trainSpec(4, deepspeed(sp(4))).dump(), SpecPurpose::kPlan);
    REQUIRE(spec.isOk());
    CHECK(compilePlan(model, *spec).status().message() ==
          "sequence_parallel_size 4: num_key_value_heads 6 neither splits into it nor divides it");
  }
  // heads per tensor-parallel rank against sp: 32 / tp 8 = 4 heads cannot scatter over sp 8.
  CHECK(rejection("llama3_8b.json", trainSpec(64, deepspeed({{"tensor_parallel", {{"autotp_size", 8}}},
                                                             {"sequence_parallel_size", 8}}))) ==
        "sequence_parallel_size 8: the 4 attention heads of a tensor-parallel rank (num_attention_heads 32 / tensor "
        "parallel 8) are not a multiple of it");
  const auto ep = [](int n) { return json{{"expert_parallel", {{"enabled", true}, {"autoep_size", n}}}}; };
  // experts % ep: Mixtral's 8 experts over 3 ranks
  CHECK(rejection("mixtral_8x7b.json", trainSpec(6, deepspeed(ep(3)))) ==
        "expert_parallel.autoep_size 3: the 8 experts do not split evenly over it");
  // ep not dividing dp x sp: 8 ranks with tp 2 leave dp 4
  CHECK(rejection("mixtral_8x7b.json", trainSpec(8, deepspeed({{"tensor_parallel", {{"autotp_size", 2}}},
                                                               {"expert_parallel",
                                                                {{"enabled", true}, {"autoep_size", 8}}}}))) ==
        "deepspeed.expert_parallel.autoep_size 8 must divide data parallel x sequence parallel = 4 x 1 = 4 "
        "(resources.ranks 8 over tensor parallel 2): the experts split over ranks that hold the same tensor-parallel "
        "piece");
  // expert parallelism on a dense model
  CHECK(rejection("llama3_8b.json", trainSpec(2, deepspeed(ep(2)))) ==
        "expert_parallel.autoep_size 2: llama has no experts");
  // memory: Llama-3-8B on one 80 GiB device without ZeRO. Weights 16,060,522,496 B + gradients
  // as much + optimizer 96,363,134,976 B (12 per element) + activations 22,456,303,616 B (4096
  // tokens x 4096 x 32 layers x 34 + 8 x 4096 x 128256 for the logits) = 150,940,483,584 B =
  // 140.6 GiB, 60.6 GiB too many.
  CHECK(rejection("llama3_8b.json", trainSpec(1, deepspeed())) ==
        "resources.device_memory_gb 80: estimated 140.6 GiB per rank is 60.6 GiB above the device's 80.0 GiB; the "
        "largest term is optimizer state (89.7 GiB)");
  // ZeRO 3 over 8 ranks fits.
  CHECK(compile("llama3_8b.json", trainSpec(8, deepspeed({{"zero_optimization", {{"stage", 3}}}}))).isOk());
}

TEST_CASE("plan rejections: expert_parallel settings that contradict the model", "[planner][plan]") {
  const auto ep = [](const json& patch) {
    json e{{"enabled", true}, {"autoep_size", 8}};
    e.merge_patch(patch);
    return json{{"expert_parallel", e}};
  };
  CHECK(rejection("mixtral_8x7b.json", trainSpec(8, deepspeed(ep({{"preset_model", "deepseek_v3"}})))) ==
        "deepspeed.expert_parallel.preset_model: \"deepseek_v3\" does not fit a mixtral model (its preset is mixtral)");
  CHECK(rejection("mixtral_8x7b.json", trainSpec(8, deepspeed(ep({{"top_k", 9}})))) ==
        "deepspeed.expert_parallel.top_k: 9 is above the model's 8 experts");
  CHECK(rejection("mixtral_8x7b.json", trainSpec(8, deepspeed(ep({{"num_expert_groups", 3}})))) ==
        "deepspeed.expert_parallel.num_expert_groups: the 8 experts do not form 3 equal groups");
  CHECK(rejection("mixtral_8x7b.json", trainSpec(8, deepspeed(ep({{"has_shared_experts", true}})))) ==
        "deepspeed.expert_parallel.has_shared_experts: true, but the mixtral model has none");
  CHECK(rejection("deepseek_v3.json", trainSpec(64, deepspeed(ep({{"has_shared_experts", false}})))) ==
        "deepspeed.expert_parallel.has_shared_experts: false, but the deepseek_v3 model has them (their parameters "
        "are in its checkpoint)");
  // Settings the model leaves open are taken as given.
  const Plan plan = compiled("mixtral_8x7b.json",
                             trainSpec(8, deepspeed(ep({{"route_norm", true}, {"route_scale", 2.0}, {"top_k", 4},
                                                        {"score_func", "sigmoid"}})),
                                       4096, {{"device", "cpu"}}));
  CHECK((plan.routing->normalizeTopK && plan.routing->routeScale == 2.0 && plan.routing->topK == 4));
  CHECK(plan.routing->scoring == RouterConfig::Scoring::kSigmoid);
}

TEST_CASE("plan rejections: train.frozen_parameters that hold nothing or everything", "[planner][plan]") {
  auto frozen = [](const json& patterns) {
    json spec = trainSpec(8, deepspeed({{"zero_optimization", {{"stage", 3}}}}));
    spec["train"]["frozen_parameters"] = patterns;
    return spec;
  };
  compiled("llama3_8b.json", frozen({"model\\.embed_tokens\\.weight", "model\\.layers\\.[0-3]\\..*"}));
  // A typo would train what was meant to stay fixed.
  CHECK(rejection("llama3_8b.json", frozen({"model\\.embed_tokens\\.weight", "model\\.embed\\.weight"})) ==
        "train.frozen_parameters[1]: \"model\\.embed\\.weight\" matches no parameter of the model (names look like "
        "model.layers.0.input_layernorm.weight)");
  // The memory estimate gives frozen parameters no gradient, master or optimizer state: freezing
  // the embedding (128,256 x 4,096) saves 4 + 8 bytes (fp32 master, AdamW's two moments) of each
  // of its elements over 8 ranks at stage 3, and its bf16 gradient part.
  const Plan all = compiled("llama3_8b.json", frozen(json::array()));
  const Plan noEmbedding = compiled("llama3_8b.json", frozen({"model\\.embed_tokens\\.weight"}));
  const int64_t embedding = int64_t{128256} * 4096;
  CHECK(all.memory.optimizer - noEmbedding.memory.optimizer == 12 * embedding / 8);
  CHECK(all.memory.gradients - noEmbedding.memory.gradients == 2 * embedding / 8);
  CHECK(all.memory.parameters == noEmbedding.memory.parameters);
  // Marked in the Plan; at stages 1 and 2 outside the flat buffers (the worker's ZeRO engines take
  // their partitions from there), so the embedding's block has none.
  CHECK(parameter(noEmbedding, "model.embed_tokens.weight").frozen);
  CHECK_FALSE(parameter(noEmbedding, "lm_head.weight").frozen);
  json stage1 = frozen({"model\\.embed_tokens\\.weight"});
  stage1["deepspeed"]["zero_optimization"]["stage"] = 1;
  const Plan buffers = compiled("llama3_8b.json", stage1);
  CHECK(buffers.zero.buffers.front().block == 1);  // the first layer's: block 0 (the embedding) has no buffer
  CHECK(buffers.zero.buffers.size() == 33);        // 32 layers, the final norm and head
  CHECK(rejection("llama3_8b.json", frozen({".*"})) ==
        "train.frozen_parameters: every one of the model's 291 parameters is frozen");
  // Stages 1-2 under expert parallelism: one partition serves every rank's experts of a layer.
  json experts = trainSpec(8, deepspeed({{"zero_optimization", {{"stage", 2}}},
                                         {"expert_parallel", {{"enabled", true}, {"autoep_size", 8}}}}),
                           4096, {{"device", "cpu"}});
  experts["train"]["frozen_parameters"] = {"model\\.layers\\.0\\.block_sparse_moe\\.experts\\.3\\.w1\\.weight"};
  CHECK(rejection("mixtral_8x7b.json", experts) ==
        "train.frozen_parameters: at ZeRO stage 2 under expert parallelism, layer 0's experts are frozen unevenly over "
        "the expert-parallel ranks (expert-parallel rank 0 trains 3 of its tensors, expert-parallel rank 3 trains 2): "
        "freeze the same tensors of every rank's experts, or use stage 0 or 3");
  experts["train"]["frozen_parameters"] = {"model\\.layers\\.0\\.block_sparse_moe\\.experts\\.\\d+\\.w1\\.weight"};
  compiled("mixtral_8x7b.json", experts);
  // Not a regular expression: refused when the spec is read, by index.
  auto bad = parseJobSpec(frozen({"model.layers.(0"}).dump(), SpecPurpose::kPlan);
  REQUIRE_FALSE(bad.isOk());
  CHECK(bad.status().message().rfind("train.frozen_parameters[0]: \"model.layers.(0\" is not a regular expression", 0) ==
        0);
}

TEST_CASE("Muon: matrices marked, per-head widths on each rank's shard, memory from the optimizer rules",
          "[planner][plan][muon]") {
  const json muon{{"optimizer", {{"type", "Muon"}, {"params", {{"lr", 0.02}, {"per_head_muon", true}}}}},
                  {"tensor_parallel", {{"autotp_size", 8}}},
                  {"zero_optimization", {{"stage", 3}}}};
  const Plan plan = compiled("llama3_8b.json", trainSpec(64, deepspeed(muon), 8192));
  const std::string l = "model.layers.3.";
  // q: 32 heads of 128 (4 whole heads on each rank's 512 rows); k, v: 8 KV heads of 128.
  const auto& q = parameter(plan, l + "self_attn.q_proj.weight");
  CHECK((q.muon && q.muonHeadDim == 128 && q.localShape[0] / q.muonHeadDim == 4));
  CHECK((parameter(plan, l + "self_attn.k_proj.weight").muon && parameter(plan, l + "self_attn.v_proj.weight").muonHeadDim == 128));
  // The output projection's heads are on its input dimension: Muon, as one matrix.
  CHECK((parameter(plan, l + "self_attn.o_proj.weight").muon && parameter(plan, l + "self_attn.o_proj.weight").muonHeadDim == 0));
  CHECK((parameter(plan, l + "mlp.down_proj.weight").muon && parameter(plan, l + "mlp.down_proj.weight").muonHeadDim == 0));
  // The embedding, the head and every vector go to the auxiliary Adam.
  CHECK_FALSE(parameter(plan, "model.embed_tokens.weight").muon);
  CHECK_FALSE(parameter(plan, "lm_head.weight").muon);
  CHECK_FALSE(parameter(plan, l + "input_layernorm.weight").muon);

  // Memory: fp32 masters (4 B) plus one momentum on the 6,979,321,856 matrix elements and Adam's
  // two moments on the other 1,050,939,392, against AdamW's 4 + 8 on all 8,030,261,248.
  const Plan adam = compiled("llama3_8b.json", trainSpec(64, deepspeed({{"tensor_parallel", {{"autotp_size", 8}}},
                                                                        {"zero_optimization", {{"stage", 3}}}}),
                                                          8192));
  const double states = 1.0 + 1'050'939'392.0 / 8'030'261'248.0;
  CHECK(static_cast<double>(plan.memory.optimizer) / static_cast<double>(adam.memory.optimizer) ==
        Approx((4.0 + 4.0 * states) / 12.0).epsilon(1e-6));
}

TEST_CASE("Muon: latent attention's per-head widths; an opt-in that tags nothing is refused", "[planner][plan][muon]") {
  const json muon{{"optimizer", {{"type", "Muon"}, {"params", {{"per_head_muon", true}}}}},
                  {"expert_parallel", {{"enabled", true}, {"autoep_size", 64}}},
                  {"zero_optimization", {{"stage", 3}}}};
  const Plan plan = compiled("deepseek_v3.json", trainSpec(256, deepspeed(muon), 2048, {{"device_memory_gb", 141}}));
  // q_b_proj: 128 heads of 128 + 64 (nope + rope); kv_b_proj: 128 heads of 128 + 128 (nope + v).
  CHECK(parameter(plan, "model.layers.5.self_attn.q_b_proj.weight").muonHeadDim == 192);
  CHECK(parameter(plan, "model.layers.5.self_attn.kv_b_proj.weight").muonHeadDim == 256);
  // The latent down-projections mix latents and rope: whole matrices.
  const auto& latent = parameter(plan, "model.layers.5.self_attn.kv_a_proj_with_mqa.weight");
  CHECK((latent.muon && latent.muonHeadDim == 0));

  json frozen = trainSpec(8, deepspeed({{"optimizer", {{"type", "Muon"}, {"params", {{"per_head_muon", true}}}}},
                                        {"zero_optimization", {{"stage", 3}}}}));
  frozen["train"]["frozen_parameters"] = {".*self_attn\\.[qkv]_proj.*"};
  auto refused = compile("llama3_8b.json", frozen);
  REQUIRE_FALSE(refused.isOk());
  INFO(refused.status().message());
  CHECK(refused.status().message().find("deepspeed.optimizer.params.per_head_muon: the llama model has no trainable "
                                        "attention projection") != std::string::npos);
}
