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
