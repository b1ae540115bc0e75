#include "worker/torch/rollout/step_batch.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>

namespace loom::worker {

StepBatch makeStepBatch(const rollout::ScheduledStep& step, const rollout::Scheduler& scheduler, at::Device device,
                        int64_t slidingWindow) {
  const int64_t blockSize = scheduler.limits().blockSize;
  std::vector<size_t> order(step.chunks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return step.chunks[i].count == 1; });

  std::vector<int64_t> tokens, positions, slots, contextLens, queryStarts{0}, logitRows;
  std::vector<const std::vector<int32_t>*> tables;
  StepBatch batch;
  batch.logitRow.assign(step.chunks.size(), -1);
  int64_t singles = 0;
  size_t widest = 1;
  for (size_t i : order) {
    const rollout::ScheduledChunk& c = step.chunks[i];
    const rollout::Sequence& s = *scheduler.sequence(c.sequence);
    for (int64_t p = c.start; p < c.start + c.count; ++p) {
      tokens.push_back(s.tokens[p]);
      positions.push_back(p);
      slots.push_back(int64_t(s.blocks[p / blockSize]) * blockSize + p % blockSize);
    }
    if (c.samples > 0) {
      batch.logitRow[i] = static_cast<int64_t>(logitRows.size());
      logitRows.push_back(static_cast<int64_t>(tokens.size()) - 1);
    }
    contextLens.push_back(c.start + c.count);
    queryStarts.push_back(static_cast<int64_t>(tokens.size()));
    tables.push_back(&s.blocks);
    widest = std::max(widest, s.blocks.size());
    if (c.count == 1) ++singles;
  }
  // Block tables padded with block 0, which the attention masks out.
  std::vector<int64_t> blockTables(tables.size() * widest, 0);
  for (size_t r = 0; r < tables.size(); ++r) std::copy(tables[r]->begin(), tables[r]->end(), blockTables.begin() + r * widest);

  // One host buffer (pinned for a GPU), one copy that does not wait for the device; the step's
  // tensors are views of its copy.
  const std::vector<const std::vector<int64_t>*> parts{&tokens, &positions, &slots, &logitRows, &blockTables,
                                                       &contextLens};
  int64_t total = 0;
  for (const auto* part : parts) total += static_cast<int64_t>(part->size());
  at::Tensor host = at::empty({total}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  int64_t* out = host.data_ptr<int64_t>();
  for (const auto* part : parts) out = std::copy(part->begin(), part->end(), out);
  const at::Tensor all = host.to(device, /*non_blocking=*/true);
  std::vector<at::Tensor> views;
  int64_t offset = 0;
  for (const auto* part : parts) {
    views.push_back(all.narrow(0, offset, static_cast<int64_t>(part->size())));
    offset += static_cast<int64_t>(part->size());
  }
  batch.tokens = views[0];
  batch.paged.positions = views[1];
  batch.paged.slots = views[2];
  batch.paged.logitRows = views[3];
  PagedSequences& seqs = batch.paged.sequences;
  seqs.blockTables = views[4].view({static_cast<int64_t>(tables.size()), static_cast<int64_t>(widest)});
  seqs.contextLens = views[5];
  seqs.contextLensHost = std::move(contextLens);
  seqs.queryStarts = std::move(queryStarts);
  seqs.numSingleQuery = singles;
  seqs.blockSize = blockSize;
  seqs.slidingWindow = slidingWindow;
  return batch;
}

}  // namespace loom::worker
