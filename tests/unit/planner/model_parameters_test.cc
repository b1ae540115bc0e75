#include "planner/model_parameters.h"

#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

namespace {

ModelConfig parse(const std::string& json) {
  auto c = parseModelConfig(json);
  INFO(c.status().toString());
  REQUIRE(c.isOk());
  return *c;
}

}  // namespace

// Published parameter counts of the models whose config.json these fields come from.
TEST_CASE("parameter counts match the published models", "[planner]") {
  auto llama3_8b = parse(R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "tie_word_embeddings": false, "attention_bias": false, "rope_scaling": {"rope_type": "llama3"}})");
  CHECK(countParameters(enumerateParameters(llama3_8b)) == 8'030'261'248);

  auto llama32_1b = parse(R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "tie_word_embeddings": true})");
  CHECK(countParameters(enumerateParameters(llama32_1b)) == 1'235'814'400);

  auto mistral_7b = parse(R"({"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "tie_word_embeddings": false})");
  CHECK(countParameters(enumerateParameters(mistral_7b)) == 7'241'732'096);

  auto qwen2_05b = parse(R"({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "tie_word_embeddings": true})");
  CHECK(countParameters(enumerateParameters(qwen2_05b)) == 494'032'768);

  auto qwen3_06b = parse(R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "tie_word_embeddings": true, "attention_bias": false})");
  CHECK(countParameters(enumerateParameters(qwen3_06b)) == 596'049'920);
}

TEST_CASE("names and shapes are Hugging Face's", "[planner]") {
  auto qwen2 = parse(R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": false})");
  auto params = enumerateParameters(qwen2);
  CHECK(params.front().name == "model.embed_tokens.weight");
  CHECK(params.front().shape == std::vector<int64_t>{100, 16});
  CHECK(params.back().name == "lm_head.weight");
  auto find = [&](const std::string& name) {
    for (const auto& p : params) {
      if (p.name == name) return p.shape;
    }
    return std::vector<int64_t>{-1};
  };
  CHECK(find("model.layers.1.self_attn.k_proj.weight") == std::vector<int64_t>{8, 16});  // 2 kv heads x head_dim 4
  CHECK(find("model.layers.1.self_attn.k_proj.bias") == std::vector<int64_t>{8});
  CHECK(find("model.layers.1.self_attn.o_proj.bias") == std::vector<int64_t>{-1});  // qwen2: q, k, v only
  CHECK(find("model.layers.0.mlp.down_proj.weight") == std::vector<int64_t>{16, 32});
  CHECK(find("model.norm.weight") == std::vector<int64_t>{16});
}

TEST_CASE("bad model configs name the field and the file", "[planner]") {
  auto error = [](const std::string& json) {
    auto c = parseModelConfig(json, "models/x/config.json");
    REQUIRE_FALSE(c.isOk());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    return c.status().message();
  };
  CHECK(error(R"({"model_type": "gpt2"})").find("models/x/config.json: model_type: \"gpt2\" is not a model") == 0);
  CHECK(error(R"({"model_type": "llama", "vocab_size": 10})") ==
        "models/x/config.json: hidden_size: required field is missing");
  CHECK(error(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 3})")
            .find("num_attention_heads 4 is not a multiple of num_key_value_heads 3") != std::string::npos);
  CHECK(error(R"({"model_type": "llama", "vocab_size": "10"})") ==
        "models/x/config.json: vocab_size: must be an integer, got string");
  CHECK(error("{").find("models/x/config.json: not valid JSON") == 0);
}

TEST_CASE("mixture-of-experts models: routers - experts tagged - published counts", "[planner]") {
  auto mixtral = parse(R"({"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": false})");
  auto params = enumerateParameters(mixtral);
  CHECK(countParameters(params) == 46'702'792'704);  // Mixtral-8x7B
  int experts = 0;
  for (const auto& p : params) {
    if (p.name == "model.layers.0.block_sparse_moe.experts.7.w2.weight") {
      CHECK(p.expert == 7);
      CHECK(p.shape == std::vector<int64_t>{4096, 14336});
    }
    experts += p.expert >= 0;
  }
  CHECK(experts == 32 * 8 * 3);

  auto qwen3_30b = parse(R"({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": false})");
  CHECK(countParameters(enumerateParameters(qwen3_30b)) == 30'532'122'624);  // Qwen3-30B-A3B
}

TEST_CASE("Qwen-MoE dense layers: decoder_sparse_step and mlp_only_layers", "[planner]") {
  const std::string base = R"({"model_type": "qwen3_moe", "vocab_size": 32, "hidden_size": 8,
    "intermediate_size": 24, "moe_intermediate_size": 4, "num_hidden_layers": 4, "num_attention_heads": 2,
    "head_dim": 4, "num_experts_per_tok": 2, )";
  // transformers 5 saves qwen3_moe's num_experts as num_local_experts.
  auto stepped = parse(base + R"("num_local_experts": 4, "decoder_sparse_step": 2})");
  CHECK(stepped.numExperts == 4);
  CHECK_FALSE(stepped.isMoeLayer(0));
  CHECK(stepped.isMoeLayer(1));
  CHECK_FALSE(stepped.isMoeLayer(2));
  CHECK(stepped.isMoeLayer(3));
  CHECK(stepped.numMoeLayers() == 2);
  auto listed = parse(base + R"("num_experts": 4, "mlp_only_layers": [0, 2], "output_router_logits": true,
    "router_aux_loss_coef": 0.01})");
  CHECK(listed.numMoeLayers() == 2);
  CHECK(listed.outputRouterLogits);
  CHECK(listed.routerAuxLossCoef == 0.01);
  bool denseMlp = false;
  for (const auto& p : enumerateParameters(listed)) denseMlp |= p.name == "model.layers.2.mlp.gate_proj.weight";
  CHECK(denseMlp);
  auto error = [&](const std::string& tail) {
    auto c = parseModelConfig(base + R"("num_experts": 4, )" + tail, "q/config.json");
    REQUIRE_FALSE(c.isOk());
    return c.status().message();
  };
  CHECK(error(R"("mlp_only_layers": [4]})") ==
        "q/config.json: mlp_only_layers: 4 is not a layer index (0 to 3)");
  CHECK(error(R"("mlp_only_layers": 1})") == "q/config.json: mlp_only_layers: must be a list of layer indices");
  CHECK(error(R"("router_jitter_noise": 0.1})") ==
        "q/config.json: router_jitter_noise: 0.1 is not supported (0: no noise on the router's input)");
}

TEST_CASE("Qwen2-MoE: shared expert and its gate - published count", "[planner]") {
  auto qwen15_moe = parse(R"({"model_type": "qwen2_moe", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "tie_word_embeddings": false})");
  auto params = enumerateParameters(qwen15_moe);
  CHECK(countParameters(params) == 14'315'784'192);  // Qwen1.5-MoE-A2.7B
  bool sharedGate = false;
  for (const auto& p : params) sharedGate |= p.name == "model.layers.5.mlp.shared_expert_gate.weight" && p.expert == -1;
  CHECK(sharedGate);
}

namespace {

// DeepSeek-V3's config.json as published (auto_map left out); fields HF ignores
// (quantization_config, num_nextn_predict_layers, ep_size, ...) are kept to show they parse.
const char* kDeepseekV3 = R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
    "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
    "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";

std::vector<int64_t> shapeOf(const std::vector<ParameterInfo>& params, const std::string& name) {
  for (const auto& p : params) {
    if (p.name == name) return p.shape;
  }
  return {-1};
}

}  // namespace

TEST_CASE("DeepSeek-V3: published count - routing fields - yarn", "[planner]") {
  auto c = parse(kDeepseekV3);
  auto params = enumerateParameters(c);
  // HF's DeepseekV3ForCausalLM has no multi-token-prediction layer (it skips the checkpoint's
  // model.layers.61.* on load), and neither does this list. In elements:
  //   attention, per layer: q_a_proj 1536x7168 + q_a_layernorm 1536 + q_b_proj (128x192)x1536
  //     + kv_a_proj_with_mqa (512+64)x7168 + kv_a_layernorm 512 + kv_b_proj (128x(128+128))x512
  //     + o_proj 7168x(128x128) = 187,107,328, plus the two layer norms 2x7168
  //   dense MLP, layers 0-2: 3x7168x18432 = 396,361,728
  //   experts, layers 3-60: router 256x7168 + correction bias 256 + 256 x 3x7168x2048
  //     + shared experts 3x7168x(2048x1) = 11,320,164,608
  //   3 x 583,483,392 + 58 x 11,507,286,272 + embedding and head 2x129280x7168 + norm 7168
  //     = 671,026,419,200
  // DeepSeek's 671B of main-model weights (685B on the Hub with the 14B MTP module), and the sum
  // of parameters and persistent buffers of transformers 5.17's model built from this config on
  // the meta device.
  CHECK(countParameters(params) == 671'026'419'200);

  CHECK(c.family == ModelFamily::kDeepseekV3);
  CHECK(std::string(modelFamilyName(c.family)) == "deepseek_v3");
  CHECK(c.isMla());
  CHECK(c.mla.qLoraRank == 1536);
  CHECK(c.mla.qkHeadDim() == 192);
  CHECK(c.headDim == 64);  // HF's head_dim for MLA is the rotary width
  CHECK(c.numKvHeads == 128);
  CHECK(c.numExperts == 256);
  CHECK(c.expertsPerToken == 8);
  CHECK(c.firstDenseLayers == 3);
  CHECK(c.sharedExpertIntermediateSize == 2048);
  CHECK(c.router.scoring == RouterConfig::Scoring::kSigmoid);
  CHECK(c.router.normalizeTopK);
  CHECK(c.router.scalingFactor == 2.5);
  CHECK(c.router.groups == 8);
  CHECK(c.router.groupsPerToken == 4);
  CHECK(c.router.scoreCorrectionBias);
  CHECK(c.rope.type == RopeConfig::Type::kYarn);
  CHECK(c.rope.factor == 40);
  CHECK(c.rope.originalMaxPositions == 4096);
  CHECK(c.rope.mscaleAllDim == 1.0);

  CHECK(shapeOf(params, "model.layers.2.mlp.down_proj.weight") == std::vector<int64_t>{7168, 18432});
  CHECK(shapeOf(params, "model.layers.2.mlp.gate.weight") == std::vector<int64_t>{-1});
  CHECK(shapeOf(params, "model.layers.3.mlp.gate_proj.weight") == std::vector<int64_t>{-1});
  CHECK(shapeOf(params, "model.layers.60.mlp.shared_experts.down_proj.weight") == std::vector<int64_t>{7168, 2048});
  CHECK(shapeOf(params, "model.layers.61.input_layernorm.weight") == std::vector<int64_t>{-1});  // MTP: not HF's
  int experts = 0, buffers = 0;
  for (const auto& p : params) {
    if (p.name == "model.layers.3.mlp.experts.255.down_proj.weight") {
      CHECK(p.expert == 255);
      CHECK(p.shape == std::vector<int64_t>{7168, 2048});
    }
    if (p.name.find("shared_experts") != std::string::npos) CHECK(p.expert == -1);
    experts += p.expert >= 0;
    buffers += !p.trainable;
  }
  CHECK(experts == 58 * 256 * 3);
  CHECK(buffers == 58);  // one e_score_correction_bias per expert layer
}

TEST_CASE("DeepSeek-V3: every tensor named and shaped as HF's checkpoint", "[planner]") {
  // Sizes all different, so a swapped dimension shows. The expected list is what transformers
  // 5.17's DeepseekV3ForCausalLM writes with save_pretrained for this config.
  auto c = parse(R"({"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 40,
    "moe_intermediate_size": 8, "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 2,
    "q_lora_rank": 10, "kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 3,
    "n_routed_experts": 2, "n_shared_experts": 3, "num_experts_per_tok": 1, "n_group": 1, "topk_group": 1,
    "attention_bias": true, "tie_word_embeddings": false})");
  auto attention = [](int layer) {
    const std::string a = "model.layers." + std::to_string(layer) + ".self_attn.";
    return std::vector<std::pair<std::string, std::vector<int64_t>>>{
        {a + "q_a_proj.weight", {10, 16}},
        {a + "q_a_proj.bias", {10}},
        {a + "q_a_layernorm.weight", {10}},
        {a + "q_b_proj.weight", {12, 10}},  // 2 heads x (4 + 2)
        {a + "kv_a_proj_with_mqa.weight", {8, 16}},  // 6 + 2
        {a + "kv_a_proj_with_mqa.bias", {8}},
        {a + "kv_a_layernorm.weight", {6}},
        {a + "kv_b_proj.weight", {14, 6}},  // 2 heads x (4 + 3)
        {a + "o_proj.weight", {16, 6}},  // 2 heads x 3
        {a + "o_proj.bias", {16}},
    };
  };
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected{{"model.embed_tokens.weight", {64, 16}},
                                                                     {"model.layers.0.input_layernorm.weight", {16}}};
  for (auto& p : attention(0)) expected.push_back(p);
  for (auto& p : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"model.layers.0.post_attention_layernorm.weight", {16}},
           {"model.layers.0.mlp.gate_proj.weight", {40, 16}},
           {"model.layers.0.mlp.up_proj.weight", {40, 16}},
           {"model.layers.0.mlp.down_proj.weight", {16, 40}},
           {"model.layers.1.input_layernorm.weight", {16}}})
    expected.push_back(p);
  for (auto& p : attention(1)) expected.push_back(p);
  for (auto& p : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"model.layers.1.post_attention_layernorm.weight", {16}},
           {"model.layers.1.mlp.gate.weight", {2, 16}},
           {"model.layers.1.mlp.gate.e_score_correction_bias", {2}},
           {"model.layers.1.mlp.experts.0.gate_proj.weight", {8, 16}},
           {"model.layers.1.mlp.experts.0.up_proj.weight", {8, 16}},
           {"model.layers.1.mlp.experts.0.down_proj.weight", {16, 8}},
           {"model.layers.1.mlp.experts.1.gate_proj.weight", {8, 16}},
           {"model.layers.1.mlp.experts.1.up_proj.weight", {8, 16}},
           {"model.layers.1.mlp.experts.1.down_proj.weight", {16, 8}},
           {"model.layers.1.mlp.shared_experts.gate_proj.weight", {24, 16}},  // 3 shared experts x 8
           {"model.layers.1.mlp.shared_experts.up_proj.weight", {24, 16}},
           {"model.layers.1.mlp.shared_experts.down_proj.weight", {16, 24}},
           {"model.norm.weight", {16}},
           {"lm_head.weight", {64, 16}}})
    expected.push_back(p);

  auto params = enumerateParameters(c);
  REQUIRE(params.size() == expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(i);
    CHECK(params[i].name == expected[i].first);
    CHECK(params[i].shape == expected[i].second);
    CHECK(params[i].trainable == (params[i].name.find("e_score_correction_bias") == std::string::npos));
  }
  CHECK(countParameters(params) == 7278);
}

TEST_CASE("DeepSeek-V3 without a query latent: a plain q_proj, and no bias on it", "[planner]") {
  auto c = parse(R"({"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 40,
    "moe_intermediate_size": 8, "num_hidden_layers": 1, "first_k_dense_replace": 0, "num_attention_heads": 2,
    "q_lora_rank": null, "kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 3,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
    "attention_bias": true})");
  auto params = enumerateParameters(c);
  CHECK(c.mla.qLoraRank == 0);
  CHECK(shapeOf(params, "model.layers.0.self_attn.q_proj.weight") == std::vector<int64_t>{12, 16});
  CHECK(shapeOf(params, "model.layers.0.self_attn.q_proj.bias") == std::vector<int64_t>{-1});  // HF: bias=False
  CHECK(shapeOf(params, "model.layers.0.self_attn.q_a_proj.weight") == std::vector<int64_t>{-1});
  CHECK(shapeOf(params, "model.layers.0.self_attn.q_a_layernorm.weight") == std::vector<int64_t>{-1});
  CHECK(shapeOf(params, "model.layers.0.self_attn.kv_a_proj_with_mqa.bias") == std::vector<int64_t>{8});
  CHECK(shapeOf(params, "model.layers.0.self_attn.kv_b_proj.bias") == std::vector<int64_t>{-1});
  CHECK(shapeOf(params, "model.layers.0.mlp.experts.3.up_proj.weight") == std::vector<int64_t>{8, 16});
  // Routing fields take HF's defaults when the config leaves them out.
  CHECK(c.router.scalingFactor == 2.5);
  CHECK(c.router.normalizeTopK);
  CHECK(c.rope.type == RopeConfig::Type::kDefault);
}

TEST_CASE("DeepSeek-V3 configs HF would build differently are refused by field", "[planner]") {
  auto json = [](const std::string& fields) {
    return R"({"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 40,
      "moe_intermediate_size": 8, "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 2,
      "kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 3, "n_routed_experts": 4,
      "n_shared_experts": 1, )" +
           fields + "}";
  };
  auto error = [&](const std::string& fields) {
    auto c = parseModelConfig(json(fields), "ds/config.json");
    REQUIRE_FALSE(c.isOk());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    return c.status().message();
  };
  const std::string routing = R"("num_experts_per_tok": 2, "n_group": 2, "topk_group": 1)";
  const std::string ok = routing + R"(, "q_lora_rank": 10)";
  REQUIRE(parseModelConfig(json(ok)).isOk());
  CHECK(error(ok + R"(, "moe_layer_freq": 2)") ==
        "ds/config.json: moe_layer_freq: 2 is not supported (deepseek_v3 has experts in every layer from "
        "first_k_dense_replace on: moe_layer_freq 1)");
  CHECK(error(routing) == "ds/config.json: q_lora_rank: required field is missing (null for a plain q_proj)");
  CHECK(error(ok + R"(, "num_key_value_heads": 1)").find("num_key_value_heads 1 must equal num_attention_heads 2") !=
        std::string::npos);
  CHECK(error(ok + R"(, "scoring_func": "softmax")") ==
        "ds/config.json: scoring_func: \"softmax\" is not supported (deepseek_v3 scores experts with a sigmoid)");
  CHECK(error(ok + R"(, "topk_method": "greedy")").find("topk_method: \"greedy\" is not supported") !=
        std::string::npos);
  CHECK(error(R"("num_experts_per_tok": 2, "n_group": 3, "q_lora_rank": 10)") ==
        "ds/config.json: n_routed_experts 4 does not split into n_group 3 equal groups");
  // HF's defaults are 8 groups choosing from 4: too many groups for 4 experts.
  CHECK(error(R"("num_experts_per_tok": 2, "q_lora_rank": 10)") ==
        "ds/config.json: n_routed_experts 4 does not split into n_group 8 equal groups");
  CHECK(error(R"("num_experts_per_tok": 2, "n_group": 4, "topk_group": 1, "q_lora_rank": 10)") ==
        "ds/config.json: n_group 4: each group needs at least 2 of the 4 experts");
  CHECK(error(R"("num_experts_per_tok": 2, "n_group": 2, "topk_group": 3, "q_lora_rank": 10)") ==
        "ds/config.json: topk_group 3 is above n_group 2");
  CHECK(error(R"("num_experts_per_tok": 3, "n_group": 2, "topk_group": 1, "q_lora_rank": 10)") ==
        "ds/config.json: num_experts_per_tok 3 is above the 2 experts of the topk_group 1 groups a token picks from");
  CHECK(error(ok + R"(, "rope_scaling": {"type": "yarn", "factor": 4})") ==
        "ds/config.json: rope_scaling: original_max_position_embeddings: required for rope_type yarn");
}

TEST_CASE("yarn is for deepseek_v3 only - routers say how they weight experts", "[planner]") {
  auto llama = parseModelConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 2048}})");
  REQUIRE_FALSE(llama.isOk());
  CHECK(llama.status().message() == "config.json: rope_scaling: rope_type \"yarn\" is not supported (supported: "
                                    "default, linear, llama3)");

  auto mixtral = parse(R"({"model_type": "mixtral", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2})");
  CHECK(mixtral.router.normalizeTopK);
  CHECK(mixtral.router.scoring == RouterConfig::Scoring::kSoftmax);
  CHECK_FALSE(mixtral.router.scoreCorrectionBias);
  auto qwen3Moe = parse(R"({"model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
    "moe_intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2, "num_experts": 4,
    "num_experts_per_tok": 2, "norm_topk_prob": true})");
  CHECK(qwen3Moe.router.normalizeTopK);
  CHECK(qwen3Moe.router.scalingFactor == 1.0);
  CHECK(qwen3Moe.firstDenseLayers == 0);
}
