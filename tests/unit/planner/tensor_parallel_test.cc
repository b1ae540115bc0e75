#include "planner/tensor_parallel.h"

#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

namespace {

ModelConfig llama(int64_t heads, int64_t kvHeads, int64_t vocab = 128256) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocabSize = vocab;
  c.hiddenSize = 4096;
  c.intermediateSize = 14336;
  c.numLayers = 1;
  c.numHeads = heads;
  c.numKvHeads = kvHeads;
  c.headDim = 4096 / heads;
  c.attentionBias = true;
  return c;
}

TpLayout layoutOf(const ModelConfig& c, int tp, const std::string& name, const std::vector<TpLayerSpec>& specs = {}) {
  auto params = enumerateParameters(c);
  auto layouts = layoutTensorParallel(c, params, tp, specs);
  INFO(layouts.status().toString());
  REQUIRE(layouts.isOk());
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == name) return (*layouts)[i];
  }
  FAIL("no parameter " << name);
  return {};
}

}  // namespace

TEST_CASE("AutoTP defaults: column q/k/v/gate/up - row o/down - vocab embedding and head - norms whole", "[planner]") {
  auto c = llama(32, 8);
  CHECK(layoutOf(c, 8, "model.layers.0.self_attn.q_proj.weight").localShape == std::vector<int64_t>{512, 4096});
  CHECK(layoutOf(c, 8, "model.layers.0.self_attn.k_proj.weight").localShape == std::vector<int64_t>{128, 4096});
  CHECK(layoutOf(c, 8, "model.layers.0.self_attn.k_proj.bias").localShape == std::vector<int64_t>{128});
  auto o = layoutOf(c, 8, "model.layers.0.self_attn.o_proj.weight");
  CHECK(o.split == TpSplit::kRow);
  CHECK(o.localShape == std::vector<int64_t>{4096, 512});
  CHECK(layoutOf(c, 8, "model.layers.0.self_attn.o_proj.bias").split == TpSplit::kReplicated);
  CHECK(layoutOf(c, 8, "model.layers.0.mlp.down_proj.weight").localShape == std::vector<int64_t>{4096, 1792});
  CHECK(layoutOf(c, 8, "model.layers.0.mlp.gate_proj.weight").localShape == std::vector<int64_t>{1792, 4096});
  CHECK(layoutOf(c, 8, "model.embed_tokens.weight").localShape == std::vector<int64_t>{16032, 4096});
  CHECK(layoutOf(c, 8, "lm_head.weight").split == TpSplit::kVocab);
  CHECK(layoutOf(c, 8, "model.layers.0.input_layernorm.weight").split == TpSplit::kReplicated);
}

TEST_CASE("GQA with more ranks than KV heads replicates each KV head", "[planner]") {
  auto c = llama(32, 4);
  auto k = layoutOf(c, 8, "model.layers.0.self_attn.k_proj.weight");
  CHECK(k.kvReplication == 2);
  CHECK(k.localShape == std::vector<int64_t>{128, 4096});  // one KV head (head_dim 128) per rank
  CHECK(layoutOf(c, 8, "model.layers.0.self_attn.q_proj.weight").kvReplication == 1);
}

TEST_CASE("layer_specs override the defaults - first match wins - patterns match from the start", "[planner]") {
  auto c = llama(32, 8);
  std::vector<TpLayerSpec> specs{{.patterns = {".*mlp\\.down_proj"}, .split = TpSplit::kReplicated},
                                 {.patterns = {".*mlp\\."}, .split = TpSplit::kColumn}};
  CHECK(layoutOf(c, 8, "model.layers.0.mlp.down_proj.weight", specs).split == TpSplit::kReplicated);
  CHECK(layoutOf(c, 8, "model.layers.0.mlp.up_proj.weight", specs).split == TpSplit::kColumn);
  // As Python's re.match: "mlp\." alone does not match "model.layers.0.mlp..." at its start.
  std::vector<TpLayerSpec> unanchored{{.patterns = {"mlp\\.down_proj"}, .split = TpSplit::kReplicated}};
  CHECK(layoutOf(c, 8, "model.layers.0.mlp.down_proj.weight", unanchored).split == TpSplit::kRow);
}

TEST_CASE("what cannot be split is named", "[planner]") {
  auto reason = [&](const ModelConfig& c, int tp, std::vector<TpLayerSpec> specs = {}) {
    auto l = layoutTensorParallel(c, enumerateParameters(c), tp, specs);
    REQUIRE_FALSE(l.isOk());
    CHECK(l.status().code() == StatusCode::kInvalidArgument);
    return l.status().message();
  };
  CHECK(reason(llama(32, 8), 3) == "tensor parallel 3: num_attention_heads 32 is not a multiple of it");
  CHECK(reason(llama(48, 6), 4).find("num_key_value_heads 6 neither divides it nor is divided by it") !=
        std::string::npos);
  CHECK(reason(llama(32, 8, 32001), 2).find("vocab_size 32001 is not a multiple of it") != std::string::npos);
  CHECK(reason(llama(32, 8), 2, {{.patterns = {"(["}, .split = TpSplit::kRow}}).find("is not a regex") !=
        std::string::npos);
}

TEST_CASE("AutoTP on experts: w1/w3 column - w2 row - the router whole", "[planner]") {
  auto c = *parseModelConfig(R"({"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2})");
  CHECK(layoutOf(c, 2, "model.layers.0.block_sparse_moe.gate.weight").split == TpSplit::kReplicated);
  CHECK(layoutOf(c, 2, "model.layers.0.block_sparse_moe.experts.3.w1.weight").localShape == std::vector<int64_t>{7168, 4096});
  CHECK(layoutOf(c, 2, "model.layers.0.block_sparse_moe.experts.3.w2.weight").split == TpSplit::kRow);
  CHECK(layoutOf(c, 2, "model.layers.0.block_sparse_moe.experts.3.w3.weight").split == TpSplit::kColumn);
}

namespace {

// DeepSeek-V3's sizes with 4 layers (3 dense, 1 with experts), so the layout is quick to build.
ModelConfig deepseekV3(bool attentionBias = false, const std::string& qLoraRank = "1536",
                       int64_t intermediate = 18432) {
  auto c = parseModelConfig(R"({"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
    "intermediate_size": )" + std::to_string(intermediate) + R"(, "moe_intermediate_size": 2048,
    "num_hidden_layers": 4, "first_k_dense_replace": 3, "num_attention_heads": 128, "num_key_value_heads": 128,
    "q_lora_rank": )" + qLoraRank + R"(, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8,
    "topk_group": 4, "attention_bias": )" + (attentionBias ? "true" : "false") + "}");
  INFO(c.status().toString());
  REQUIRE(c.isOk());
  return *c;
}

}  // namespace

TEST_CASE("AutoTP on latent attention: latents whole - q_b/kv_b column by heads - o_proj row", "[planner]") {
  // DeepSpeed's deepseek_v2 preset: q_a_proj and kv_a_proj_with_mqa skipped, q_b_proj and
  // kv_b_proj column-parallel, o_proj row-parallel; 128 heads over 8 ranks is 16 each.
  auto c = deepseekV3(/*attentionBias=*/true);
  const std::string a = "model.layers.3.self_attn.";
  for (const char* whole : {"q_a_proj.weight", "q_a_proj.bias", "q_a_layernorm.weight", "kv_a_proj_with_mqa.weight",
                            "kv_a_proj_with_mqa.bias", "kv_a_layernorm.weight", "o_proj.bias"}) {
    INFO(whole);
    CHECK(layoutOf(c, 8, a + whole).split == TpSplit::kReplicated);
  }
  auto qb = layoutOf(c, 8, a + "q_b_proj.weight");
  CHECK(qb.split == TpSplit::kColumn);
  CHECK(qb.localShape == std::vector<int64_t>{16 * 192, 1536});
  auto kvb = layoutOf(c, 8, a + "kv_b_proj.weight");
  CHECK(kvb.split == TpSplit::kColumn);
  CHECK(kvb.localShape == std::vector<int64_t>{16 * (128 + 128), 512});
  CHECK(kvb.kvReplication == 1);
  auto o = layoutOf(c, 8, a + "o_proj.weight");
  CHECK(o.split == TpSplit::kRow);
  CHECK(o.localShape == std::vector<int64_t>{7168, 16 * 128});

  // Without a query latent, q_proj splits by heads like q_b_proj.
  CHECK(layoutOf(deepseekV3(false, "null"), 8, a + "q_proj.weight").localShape ==
        std::vector<int64_t>{16 * 192, 7168});
}

TEST_CASE("AutoTP on DeepSeek-V3's MLPs: dense first layers - experts - shared experts - router whole",
          "[planner]") {
  auto c = deepseekV3();
  CHECK(layoutOf(c, 8, "model.layers.0.mlp.gate_proj.weight").localShape == std::vector<int64_t>{2304, 7168});
  CHECK(layoutOf(c, 8, "model.layers.2.mlp.down_proj.weight").localShape == std::vector<int64_t>{7168, 2304});
  CHECK(layoutOf(c, 8, "model.layers.3.mlp.gate.weight").split == TpSplit::kReplicated);
  CHECK(layoutOf(c, 8, "model.layers.3.mlp.gate.e_score_correction_bias").split == TpSplit::kReplicated);
  CHECK(layoutOf(c, 8, "model.layers.3.mlp.experts.17.up_proj.weight").localShape == std::vector<int64_t>{256, 7168});
  CHECK(layoutOf(c, 8, "model.layers.3.mlp.experts.17.down_proj.weight").split == TpSplit::kRow);
  CHECK(layoutOf(c, 8, "model.layers.3.mlp.shared_experts.gate_proj.weight").split == TpSplit::kColumn);
  CHECK(layoutOf(c, 8, "model.layers.3.mlp.shared_experts.down_proj.weight").localShape ==
        std::vector<int64_t>{7168, 256});

  auto reason = [](const ModelConfig& m, int tp) {
    auto l = layoutTensorParallel(m, enumerateParameters(m), tp);
    REQUIRE_FALSE(l.isOk());
    return l.status().message();
  };
  CHECK(reason(c, 3) == "tensor parallel 3: num_attention_heads 128 is not a multiple of it");
  // The dense first layers still split intermediate_size, though the model has experts.
  CHECK(reason(deepseekV3(false, "1536", 18436), 8) == "tensor parallel 8: intermediate_size 18436 is not a multiple "
                                                       "of it");
}
