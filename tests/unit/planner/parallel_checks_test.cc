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
