#include "planner/parallel_checks.h"

#include "tests/catch.h"

using namespace loom;
using namespace loom::planner;

namespace {

ModelConfig model(int64_t heads, int64_t kvHeads, int64_t experts = 0) {
  ModelConfig c;
  c.numHeads = heads;
  c.numKvHeads = kvHeads;
  c.numExperts = experts;
  c.family = experts ? ModelFamily::kMixtral : ModelFamily::kLlama;
  return c;
}

}  // namespace

TEST_CASE("Ulysses: sequence - heads - KV heads split or replicated", "[planner]") {
  CHECK(checkSequenceParallel(model(32, 8), 4, 8192).isOk());
  CHECK(checkSequenceParallel(model(32, 2), 8, 8192).isOk());  // 2 KV heads, each on 4 ranks
  CHECK(checkSequenceParallel(model(32, 8), 4, 8190).message() ==
        "sequence_parallel_size 4: the sequence length 8190 is not a multiple of it");
  CHECK(checkSequenceParallel(model(12, 12), 8, 8192).message() ==
        "sequence_parallel_size 8: num_attention_heads 12 is not a multiple of it");
  CHECK(checkSequenceParallel(model(24, 6), 4, 8192).message() ==
        "sequence_parallel_size 4: num_key_value_heads 6 neither splits into it nor divides it");
}

TEST_CASE("expert parallel: experts split evenly - dense models have none", "[planner]") {
  CHECK(checkExpertParallel(model(32, 8, 8), 8).isOk());
  CHECK(checkExpertParallel(model(32, 8, 8), 3).message() ==
        "expert_parallel.autoep_size 3: the 8 experts do not split evenly over it");
  CHECK(checkExpertParallel(model(32, 8), 2).message() == "expert_parallel.autoep_size 2: llama has no experts");
}

TEST_CASE("expert owners: consecutive experts per rank", "[planner]") {
  CHECK(expertOwner(0, 64, 8) == 0);
  CHECK(expertOwner(7, 64, 8) == 0);
  CHECK(expertOwner(8, 64, 8) == 1);
  CHECK(expertOwner(63, 64, 8) == 7);
}

TEST_CASE("DeepSeek-V3: latent attention has a key and value per query head - 256 experts", "[planner]") {
  auto c = parseModelConfig(R"({"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "first_k_dense_replace": 3,
    "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8})");
  REQUIRE(c.isOk());
  CHECK(c->numKvHeads == 128);  // Ulysses scatters the up-projected keys and values by head, like the queries
  CHECK(checkSequenceParallel(*c, 8, 4096).isOk());
  CHECK(checkSequenceParallel(*c, 256, 4096).message() ==
        "sequence_parallel_size 256: num_attention_heads 128 is not a multiple of it");
  CHECK(checkExpertParallel(*c, 64).isOk());
  CHECK(checkExpertParallel(*c, 3).message() ==
        "expert_parallel.autoep_size 3: the 256 experts do not split evenly over it");
  CHECK(expertOwner(255, c->numExperts, 64) == 63);
}
