#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>
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
  // kPendingTokens, kPendingRows: StepBatch's fields of those names, empty without pending tokens.
  enum Part {
    kTokens, kPositions, kSlots, kLogitRows, kBlockTables, kContextLens, kQueryStarts, kCopies,
    kPromptKeySlots, kPromptQueryStarts, kPromptKeyStarts, kPendingTokens, kPendingRows, kNumParts
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
  at::Tensor tokens;  // [T] int64; tokens[pendingTokens[i]] is still to come (fillPendingTokens)
  PagedStep paged;
  // KV blocks to copy before the step, from[i] to to[i]: the copy on write of a shared block.
  at::Tensor copyFrom, copyTo;  // undefined: no copy
  // The decodes whose input token the step before draws on the device, and that token's row
  // among the step before's draws. Undefined: none.
  at::Tensor pendingTokens, pendingRows;
};

// Where a kPendingToken's value comes from: the row, among the draws of the step still
// running, of the token it draws for the sequence.
using PendingRows = std::unordered_map<rollout::SequenceId, int64_t>;

// `logitRow`: for each chunk of the step, in the step's order, its row of the logits, or -1 when
// it draws nothing (a prompt not yet wholly computed). `pendingRows` covers every sequence whose
// token is pending (null: none is).
HostStep encodeStep(const rollout::ScheduledStep& step, const rollout::Scheduler& scheduler, bool pinned,
                    std::vector<int64_t>* logitRow, const PendingRows* pendingRows = nullptr);
StepBatch placeStep(const HostStep& host, at::Device device, int64_t blockSize, int64_t slidingWindow);
// Writes the pending tokens into batch.tokens from `drawn` [D], the step before's tokens on the device.
void fillPendingTokens(StepBatch& batch, const at::Tensor& drawn);

// A decode graph's static inputs (decode_graphs.h): `size` rows, one decode each, that every
// replay's step fills.
struct DecodeRows {
  at::Tensor tokens;
  PagedStep step;
};
// `size` rows of padding on `device`: token 0 at position 0 with a context of one, its key and
// value written into and read from `scratchBlock`, a block of the cache no sequence holds.
DecodeRows paddingRows(int64_t size, int64_t maxBlocksPerSequence, int64_t scratchBlock, int64_t blockSize,
                       int64_t slidingWindow, at::Device device);
// Copies a decode step's n sequences into the first n rows and makes the rest padding again,
// without waiting for the device. A row left as an earlier, larger step filled it would write its
// key and value into a slot that may since be another sequence's: a freed block taken by a new
// prompt, or a shared block that a copy on write left to the other samples.
void stageDecodeRows(const StepBatch& batch, DecodeRows& rows, int64_t scratchBlock, int64_t blockSize);

}  // namespace loom::worker
