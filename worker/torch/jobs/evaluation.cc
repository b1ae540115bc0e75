#include "worker/torch/jobs/evaluation.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>


namespace loom::worker {

StatusOr<EvalResult> evaluate(DecoderModel& model, const TokenSamples& data, int64_t micro, int64_t maxBatches,
                              bool wantLogprobs, backends::Communicator& comm) {
  at::NoGradGuard noGrad;
  const int64_t dp = comm.size(), dpRank = comm.rank();
  int64_t count = data.numSamples();
  if (maxBatches > 0) count = std::min(count, maxBatches * micro * dp);
  const int64_t seq = data.seqLen();
  EvalResult result;
  result.samples = count;
  const at::Device device = model.device();
  at::Tensor logprobs = wantLogprobs ? at::zeros({count, seq}, at::TensorOptions().dtype(at::kFloat).device(device)) : at::Tensor();
  double lossSum = 0;
  // Every rank runs the same number of forward passes (ZeRO-3 gathers parameters collectively in
  // each): a rank whose share ran out repeats sample 0 and discards the result.
  for (int64_t round = 0; round * micro * dp < count; ++round) {
    const int64_t first = (round * dp + dpRank) * micro;
    std::vector<int64_t> samples;
    for (int64_t i = first; i < std::min(count, first + micro); ++i) samples.push_back(i);
    const bool idle = samples.empty();
    if (idle) samples.push_back(0);
    at::Tensor batch = data.gather(samples).to(device);
    at::Tensor inputs = batch.slice(1, 0, seq), labels = batch.slice(1, 1, seq + 1);
    at::Tensor logits = model.logits(inputs);
    if (idle) continue;
    at::Tensor flat = logits.view({-1, logits.size(-1)});
    at::Tensor tokenLogprobs = model.tokenLogprobs(flat, labels.reshape({-1}));
    lossSum -= tokenLogprobs.sum().item<double>();
    if (wantLogprobs) logprobs.slice(0, first, first + static_cast<int64_t>(samples.size())).copy_(tokenLogprobs.view({-1, seq}));
  }
  at::Tensor sums = at::tensor({lossSum}, at::kDouble).to(device);
  RETURN_IF_ERROR(comm.allReduce(sums, backends::ReduceOp::kSum)->wait().withContext("eval: summing the loss"));
  // Each row was written by one rank; the others hold zeros there.
  if (wantLogprobs)
    RETURN_IF_ERROR(comm.allReduce(logprobs, backends::ReduceOp::kSum)->wait().withContext("eval: gathering logprobs"));
  result.tokens = count * seq;
  result.meanLoss = result.tokens ? sums.item<double>() / static_cast<double>(result.tokens) : 0.0;
  result.logprobs = logprobs;
  return result;
}

}  // namespace loom::worker
