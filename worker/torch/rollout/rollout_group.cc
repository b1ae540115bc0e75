#include "worker/torch/rollout/rollout_group.h"

#include <vector>

#include <ATen/ATen.h>

#include "worker/torch/parallel/throw_if_error.h"

namespace loom::worker {

namespace {

// kind, widest, singles, payload length, then the HostStep's part sizes.
constexpr int64_t kHeaderSize = 4 + HostStep::kNumParts;

}  // namespace

void RolloutGroup::send(Kind kind, const HostStep* step, const at::Tensor& payload) {
  std::vector<int64_t> header(kHeaderSize, 0);
  header[0] = static_cast<int64_t>(kind);
  header[3] = payload.defined() ? payload.numel() : 0;
  if (step) {
    header[1] = step->widest;
    header[2] = step->singles;
    std::copy(step->sizes.begin(), step->sizes.end(), header.begin() + 4);
  }
  throwIfError(tp_.broadcast(at::tensor(header, at::kLong).to(device_), 0)->wait().withContext("rollout step header"));
  if (header[3] > 0)
    throwIfError(tp_.broadcast(payload.to(device_), 0)->wait().withContext("rollout step"));
}

void RolloutGroup::sendStep(const HostStep& step) { send(Kind::kStep, &step, step.buffer); }

void RolloutGroup::sendReload(const std::string& dir) {
  std::vector<int64_t> bytes(dir.begin(), dir.end());
  send(Kind::kReload, nullptr, at::tensor(bytes, at::kLong));
}

void RolloutGroup::sendEnd() { send(Kind::kEnd, nullptr, at::Tensor()); }

Status RolloutGroup::follow(DecoderModel& model, PagedKvCache& cache, int64_t slidingWindow, const Reload& reload) {
  const int64_t vocab = model.config().vocabSize;
  for (;;) {
    at::Tensor header = at::empty({kHeaderSize}, at::TensorOptions().dtype(at::kLong).device(device_));
    RETURN_IF_ERROR(tp_.broadcast(header, 0)->wait().withContext("rollout step header from rank 0"));
    header = header.cpu();
    const int64_t* h = header.data_ptr<int64_t>();
    const auto kind = static_cast<Kind>(h[0]);
    at::Tensor payload;
    if (h[3] > 0) {
      payload = at::empty({h[3]}, at::TensorOptions().dtype(at::kLong).device(device_));
      RETURN_IF_ERROR(tp_.broadcast(payload, 0)->wait().withContext("rollout step from rank 0"));
      payload = payload.cpu();
    }
    switch (kind) {
      case Kind::kEnd:
        return Status::ok();
      case Kind::kReload: {
        const int64_t* b = payload.data_ptr<int64_t>();
        // A refusal is rank 0's to report: every rank reads the same files and refuses alike.
        (void)reload(std::string(b, b + payload.numel()));
        break;
      }
      case Kind::kStep: {
        HostStep step;
        step.widest = h[1];
        step.singles = h[2];
        std::copy(h + 4, h + kHeaderSize, step.sizes.begin());
        step.buffer = payload;
        const StepBatch batch = placeStep(step, device_, cache.blockSize, slidingWindow);
        cache.copyBlocks(batch.copyFrom, batch.copyTo);
        gatherLogits(model.pagedLogits(batch.tokens, batch.paged, cache), vocab);
        break;
      }
    }
  }
}

at::Tensor RolloutGroup::gatherLogits(const at::Tensor& local, int64_t vocab) {
  if (local.size(1) == vocab) return local;
  const int64_t rows = local.size(0), shard = local.size(1);
  at::Tensor gathered = at::empty({tp_.size(), rows, shard}, local.options());
  throwIfError(tp_.allGather(gathered, local.contiguous())->wait().withContext("rollout logits all-gather"));
  return gathered.permute({1, 0, 2}).reshape({rows, tp_.size() * shard});
}

int64_t RolloutGroup::minimum(int64_t value) {
  at::Tensor t = at::tensor(std::vector<int64_t>{value}, at::kLong).to(device_);
  throwIfError(tp_.allReduce(t, backends::ReduceOp::kMin)->wait().withContext("rollout KV blocks"));
  return t.cpu().item<int64_t>();
}

}  // namespace loom::worker
