#include "worker/torch/rollout/step_batch.h"

#include <ATen/ATen.h>

#include "tests/catch.h"

using namespace loom;
using namespace loom::worker;

namespace {

// A step with decodes and prompt chunks of several blocks: three requests computed, then their
// decodes beside two new prompts, one of them cut into a chunk by the token budget.
rollout::ScheduledStep mixedStep(rollout::Scheduler& scheduler) {
  for (int64_t length : {5, 20, 1}) {
    std::vector<int64_t> prompt(length, 7);
    REQUIRE(scheduler.addRequest({.prompt = prompt, .n = 1, .stop = {.maxNewTokens = 8}}).isOk());
  }
  const rollout::ScheduledStep first = scheduler.schedule();
  std::vector<std::vector<int64_t>> sampled(first.chunks.size(), std::vector<int64_t>{3});
  scheduler.complete(first, sampled);
  for (int64_t length : {37, 50}) {
    std::vector<int64_t> prompt(length, 9);
    REQUIRE(scheduler.addRequest({.prompt = prompt, .n = 1, .stop = {.maxNewTokens = 8}}).isOk());
  }
  return scheduler.schedule();
}

}  // namespace

TEST_CASE("a step's prompt chunks carry every key's cache slot and flash attention's offsets", "[rollout]") {
  rollout::Scheduler scheduler({.blockSize = 4, .numBlocks = 64, .maxNumSeqs = 8, .maxNumBatchedTokens = 64,
                                .maxModelLen = 128});
  const rollout::ScheduledStep step = mixedStep(scheduler);
  std::vector<int64_t> logitRow;
  const HostStep host = encodeStep(step, scheduler, /*pinned=*/false, &logitRow);
  const StepBatch batch = placeStep(host, at::kCPU, 4, 0);
  const PagedSequences& s = batch.paged.sequences;
  REQUIRE(s.numSingleQuery == 3);
  REQUIRE(s.numSequences() == 5);
  REQUIRE(s.promptKeySlots.defined());

  // What attention would derive in each layer: sequence i's positions 0..context-1 through its
  // block table, and the running sums of the chunks' query and key counts.
  std::vector<int64_t> slots, queryStarts{0}, keyStarts{0};
  for (int64_t i = s.numSingleQuery; i < s.numSequences(); ++i) {
    for (int64_t p = 0; p < s.contextLensHost[i]; ++p)
      slots.push_back(s.blockTables[i][p / 4].item<int64_t>() * 4 + p % 4);
    queryStarts.push_back(queryStarts.back() + s.queryStarts[i + 1] - s.queryStarts[i]);
    keyStarts.push_back(static_cast<int64_t>(slots.size()));
  }
  CHECK(keyStarts.back() == 37 + (64 - 3 - 37));  // the first prompt whole, the second up to the budget
  auto asVector = [](const at::Tensor& t) {
    const at::Tensor longs = t.to(at::kLong).contiguous();
    return std::vector<int64_t>(longs.data_ptr<int64_t>(), longs.data_ptr<int64_t>() + longs.numel());
  };
  CHECK(asVector(s.promptKeySlots) == slots);
  CHECK(asVector(s.promptQueryStarts) == queryStarts);
  CHECK(asVector(s.promptKeyStarts) == keyStarts);
  CHECK(s.promptQueryStarts.scalar_type() == at::kInt);
  CHECK(s.promptKeyStarts.scalar_type() == at::kInt);
}

TEST_CASE("a step of decodes only has no prompt keys", "[rollout]") {
  rollout::Scheduler scheduler({.blockSize = 4, .numBlocks = 16, .maxNumSeqs = 4, .maxNumBatchedTokens = 64,
                                .maxModelLen = 64});
  REQUIRE(scheduler.addRequest({.prompt = {1, 2, 3}, .n = 2, .stop = {.maxNewTokens = 4}}).isOk());
  const rollout::ScheduledStep first = scheduler.schedule();
  scheduler.complete(first, {{5, 6}});
  const rollout::ScheduledStep decodes = scheduler.schedule();
  std::vector<int64_t> logitRow;
  const StepBatch batch = placeStep(encodeStep(decodes, scheduler, false, &logitRow), at::kCPU, 4, 0);
  CHECK(batch.paged.sequences.numSingleQuery == batch.paged.sequences.numSequences());
  CHECK_FALSE(batch.paged.sequences.promptKeySlots.defined());
}

TEST_CASE("a decode graph's rows past a smaller step are padding again, not the larger step's sequences",
          "[rollout]") {
  rollout::Scheduler scheduler({.blockSize = 4, .numBlocks = 64, .maxNumSeqs = 8, .maxNumBatchedTokens = 64,
                                .maxModelLen = 128});
  std::vector<rollout::RequestId> requests;
  for (int64_t length : {6, 3, 9, 2, 5}) {
    auto id = scheduler.addRequest({.prompt = std::vector<int64_t>(length, 7), .n = 1, .stop = {.maxNewTokens = 8}});
    REQUIRE(id.isOk());
    requests.push_back(*id);
  }
  const rollout::ScheduledStep prompts = scheduler.schedule();
  scheduler.complete(prompts, std::vector<std::vector<int64_t>>(prompts.chunks.size(), std::vector<int64_t>{3}));
  auto decodeBatch = [&] {
    const rollout::ScheduledStep step = scheduler.schedule();
    std::vector<int64_t> logitRow;
    StepBatch batch = placeStep(encodeStep(step, scheduler, /*pinned=*/false, &logitRow), at::kCPU, 4, 0);
    scheduler.complete(step, std::vector<std::vector<int64_t>>(step.chunks.size(), std::vector<int64_t>{4}));
    return batch;
  };
  const int64_t scratch = 64;
  DecodeRows rows = paddingRows(8, 32, scratch, 4, 0, at::kCPU);
  const StepBatch five = decodeBatch();
  REQUIRE(five.paged.sequences.numSequences() == 5);
  stageDecodeRows(five, rows, scratch, 4);
  CHECK(at::equal(rows.step.slots.narrow(0, 0, 5), five.paged.slots));
  CHECK(at::equal(rows.step.slots.narrow(0, 5, 3), at::full({3}, scratch * 4, at::kLong)));

  // Two sequences end; their blocks may go to others, so the rows that held them must not write there.
  for (rollout::RequestId id : {requests[1], requests[3]}) scheduler.cancelRequest(id, rollout::FinishReason::kCancelled);
  const StepBatch three = decodeBatch();
  REQUIRE(three.paged.sequences.numSequences() == 3);
  stageDecodeRows(three, rows, scratch, 4);
  CHECK(at::equal(rows.tokens.narrow(0, 0, 3), three.tokens));
  CHECK(at::equal(rows.step.positions.narrow(0, 0, 3), three.paged.positions));
  CHECK(at::equal(rows.step.slots.narrow(0, 0, 3), three.paged.slots));
  CHECK(at::equal(rows.step.sequences.contextLens.narrow(0, 0, 3), three.paged.sequences.contextLens));
  CHECK(at::equal(rows.step.slots.narrow(0, 3, 5), at::full({5}, scratch * 4, at::kLong)));
  CHECK(at::equal(rows.step.sequences.contextLens.narrow(0, 3, 5), at::ones({5}, at::kLong)));
  CHECK(at::equal(rows.step.sequences.blockTables.narrow(0, 3, 5), at::full({5, 32}, scratch, at::kLong)));
  CHECK(at::equal(rows.tokens.narrow(0, 3, 5), at::zeros({5}, at::kLong)));
}
