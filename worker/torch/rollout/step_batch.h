#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/rollout/scheduler.h"
#include "worker/torch/model/paged_kv.h"

namespace loom::worker {

// A scheduled step's integers in one host buffer (pinned for a GPU), parts back to back: what
// rank 0 builds from the scheduler, sends the other ranks of a tensor-parallel rollout, and
// every rank places on its device with one copy. Single-token chunks (decodes) come first, as
// paged attention wants them.
struct HostStep {
  // kPromptKeySlots..kPromptKeyStarts: PagedSequences' prompt* fields, empty without prompt chunks.
  enum Part {
    kTokens, kPositions, kSlots, kLogitRows, kBlockTables, kContextLens, kQueryStarts, kCopies,
    kPromptKeySlots, kPromptQueryStarts, kPromptKeyStarts, kNumParts
  };
  std::array<int64_t, kNumParts> sizes{};
  int64_t widest = 1;   // block-table columns
  int64_t singles = 0;  // single-token chunks
  at::Tensor buffer;    // [sum(sizes)] int64, on the host

  int64_t offset(Part part) const;
  const int64_t* part(Part part) const { return buffer.data_ptr<int64_t>() + offset(part); }
  int64_t numSequences() const { return sizes[kContextLens]; }
};

// The step as the model takes it: the chunks' tokens flat, where each sits in its sequence and
// in the KV cache, and which rows of the logits are drawn from.
struct StepBatch {
  at::Tensor tokens;  // [T] int64
  PagedStep paged;
  // (from, to) KV blocks to copy before the step: the copy on write of a shared block.
  std::vector<std::pair<int64_t, int64_t>> copies;
};

// `logitRow`: for each chunk of the step, in the step's order, its row of the logits, or -1 when
// it draws nothing (a prompt not yet wholly computed).
HostStep encodeStep(const rollout::ScheduledStep& step, const rollout::Scheduler& scheduler, bool pinned,
                    std::vector<int64_t>* logitRow);
StepBatch placeStep(const HostStep& host, at::Device device, int64_t blockSize, int64_t slidingWindow);

}  // namespace loom::worker
