#include "worker/torch/rollout/step_batch.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>

namespace loom::worker {

int64_t HostStep::offset(Part part) const {
  int64_t at = 0;
  for (int p = 0; p < part; ++p) at += sizes[p];
  return at;
}

HostStep encodeStep(const rollout::ScheduledStep& step, const rollout::Scheduler& scheduler, bool pinned,
                    std::vector<int64_t>* logitRow, const PendingRows* pendingRows) {
  const int64_t blockSize = scheduler.limits().blockSize;
  std::vector<size_t> order(step.chunks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return step.chunks[i].count == 1; });

  std::vector<int64_t> tokens, positions, slots, contextLens, queryStarts{0}, logitRows, copies;
  std::vector<int64_t> promptKeySlots, promptQueryStarts, promptKeyStarts, pendingTokens, pendingRowsOut;
  std::vector<const std::vector<int32_t>*> tables;
  HostStep host;
  logitRow->assign(step.chunks.size(), -1);
  size_t widest = 1;
  for (size_t i : order) {
    const rollout::ScheduledChunk& c = step.chunks[i];
    const rollout::Sequence& s = *scheduler.sequence(c.sequence);
    for (int64_t p = c.start; p < c.start + c.count; ++p) {
      if (s.tokens[p] == rollout::kPendingToken) {
        pendingTokens.push_back(static_cast<int64_t>(tokens.size()));
        pendingRowsOut.push_back(pendingRows->at(s.id));
      }
      tokens.push_back(s.tokens[p] == rollout::kPendingToken ? 0 : s.tokens[p]);
      positions.push_back(p);
      slots.push_back(int64_t(s.blocks[p / blockSize]) * blockSize + p % blockSize);
    }
    if (c.samples > 0) {
      (*logitRow)[i] = static_cast<int64_t>(logitRows.size());
      logitRows.push_back(static_cast<int64_t>(tokens.size()) - 1);
    }
    contextLens.push_back(c.start + c.count);
    queryStarts.push_back(static_cast<int64_t>(tokens.size()));
    tables.push_back(&s.blocks);
    widest = std::max(widest, s.blocks.size());
    if (c.count == 1) {
      ++host.singles;
    } else {
      // Every key the chunk's queries see, from the sequence's start: attention gathers them once a step.
      if (promptQueryStarts.empty()) promptQueryStarts = {0}, promptKeyStarts = {0};
      for (int64_t p = 0; p < c.start + c.count; ++p)
        promptKeySlots.push_back(int64_t(s.blocks[p / blockSize]) * blockSize + p % blockSize);
      promptQueryStarts.push_back(promptQueryStarts.back() + c.count);
      promptKeyStarts.push_back(static_cast<int64_t>(promptKeySlots.size()));
    }
  }
  // Block tables padded with block 0, which the attention masks out.
  std::vector<int64_t> blockTables(tables.size() * widest, 0);
  for (size_t r = 0; r < tables.size(); ++r) std::copy(tables[r]->begin(), tables[r]->end(), blockTables.begin() + r * widest);
  for (const rollout::BlockCopy& c : step.copies) copies.push_back(c.from);
  for (const rollout::BlockCopy& c : step.copies) copies.push_back(c.to);

  const std::array<const std::vector<int64_t>*, HostStep::kNumParts> parts{
      &tokens,      &positions, &slots,          &logitRows,         &blockTables,
      &contextLens, &queryStarts, &copies, &promptKeySlots, &promptQueryStarts, &promptKeyStarts,
      &pendingTokens, &pendingRowsOut};
  int64_t total = 0;
  for (int p = 0; p < HostStep::kNumParts; ++p) total += host.sizes[p] = static_cast<int64_t>(parts[p]->size());
  host.widest = static_cast<int64_t>(widest);
  host.buffer = at::empty({total}, at::TensorOptions().dtype(at::kLong).pinned_memory(pinned));
  int64_t* out = host.buffer.data_ptr<int64_t>();
  for (const auto* part : parts) out = std::copy(part->begin(), part->end(), out);
  return host;
}

StepBatch placeStep(const HostStep& host, at::Device device, int64_t blockSize, int64_t slidingWindow) {
  // One copy that does not wait for the device; the step's tensors are views of it.
  const at::Tensor all = host.buffer.to(device, /*non_blocking=*/true);
  auto view = [&](HostStep::Part part) { return all.narrow(0, host.offset(part), host.sizes[part]); };
  StepBatch batch;
  batch.tokens = view(HostStep::kTokens);
  batch.paged.positions = view(HostStep::kPositions);
  batch.paged.slots = view(HostStep::kSlots);
  batch.paged.logitRows = view(HostStep::kLogitRows);
  PagedSequences& seqs = batch.paged.sequences;
  seqs.blockTables = view(HostStep::kBlockTables).view({host.numSequences(), host.widest});
  seqs.contextLens = view(HostStep::kContextLens);
  const int64_t* lens = host.part(HostStep::kContextLens);
  seqs.contextLensHost.assign(lens, lens + host.sizes[HostStep::kContextLens]);
  const int64_t* starts = host.part(HostStep::kQueryStarts);
  seqs.queryStarts.assign(starts, starts + host.sizes[HostStep::kQueryStarts]);
  seqs.numSingleQuery = host.singles;
  if (host.sizes[HostStep::kPromptKeySlots] > 0) {
    seqs.promptKeySlots = view(HostStep::kPromptKeySlots);
    seqs.promptQueryStarts = view(HostStep::kPromptQueryStarts).to(at::kInt);
    seqs.promptKeyStarts = view(HostStep::kPromptKeyStarts).to(at::kInt);
  }
  seqs.blockSize = blockSize;
  seqs.slidingWindow = slidingWindow;
  if (const int64_t copies = host.sizes[HostStep::kCopies] / 2; copies > 0) {
    batch.copyFrom = view(HostStep::kCopies).narrow(0, 0, copies);
    batch.copyTo = view(HostStep::kCopies).narrow(0, copies, copies);
  }
  if (host.sizes[HostStep::kPendingTokens] > 0) {
    batch.pendingTokens = view(HostStep::kPendingTokens);
    batch.pendingRows = view(HostStep::kPendingRows);
  }
  return batch;
}

DecodeRows paddingRows(int64_t size, int64_t maxBlocksPerSequence, int64_t scratchBlock, int64_t blockSize,
                       int64_t slidingWindow, at::Device device) {
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  DecodeRows rows;
  rows.tokens = at::zeros({size}, longs);
  rows.step.positions = at::zeros({size}, longs);
  rows.step.slots = at::full({size}, scratchBlock * blockSize, longs);
  rows.step.logitRows = at::arange(size, longs);
  PagedSequences& s = rows.step.sequences;
  s.blockTables = at::full({size, maxBlocksPerSequence}, scratchBlock, longs);
  s.contextLens = at::ones({size}, longs);
  s.contextLensHost.assign(size, 1);
  for (int64_t i = 0; i <= size; ++i) s.queryStarts.push_back(i);
  s.numSingleQuery = size;
  s.blockSize = blockSize;
  s.slidingWindow = slidingWindow;
  return rows;
}

void stageDecodeRows(const StepBatch& batch, DecodeRows& rows, int64_t scratchBlock, int64_t blockSize) {
  const PagedSequences& from = batch.paged.sequences;
  PagedSequences& to = rows.step.sequences;
  const int64_t n = from.numSequences(), pad = rows.tokens.size(0) - n;
  rows.tokens.narrow(0, 0, n).copy_(batch.tokens, /*non_blocking=*/true);
  rows.step.positions.narrow(0, 0, n).copy_(batch.paged.positions, true);
  rows.step.slots.narrow(0, 0, n).copy_(batch.paged.slots, true);
  to.contextLens.narrow(0, 0, n).copy_(from.contextLens, true);
  to.blockTables.narrow(0, 0, n).narrow(1, 0, from.blockTables.size(1)).copy_(from.blockTables, true);
  if (pad == 0) return;
  rows.tokens.narrow(0, n, pad).zero_();
  rows.step.positions.narrow(0, n, pad).zero_();
  rows.step.slots.narrow(0, n, pad).fill_(scratchBlock * blockSize);
  to.contextLens.narrow(0, n, pad).fill_(1);
  to.blockTables.narrow(0, n, pad).fill_(scratchBlock);
}

void fillPendingTokens(StepBatch& batch, const at::Tensor& drawn) {
  if (batch.pendingTokens.defined()) batch.tokens.index_copy_(0, batch.pendingTokens, drawn.index_select(0, batch.pendingRows));
}

}  // namespace loom::worker
