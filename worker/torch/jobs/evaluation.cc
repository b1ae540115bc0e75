#include "worker/torch/jobs/evaluation.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace loom::worker {

StatusOr<EvalResult> evaluate(DecoderModel& model, const TokenSamples& data, const EvalOptions& options,
                              const RankMesh& mesh) {
  at::NoGradGuard noGrad;
  backends::Communicator& comm = *mesh.denseData;
  const int64_t dp = mesh.data->size(), dpRank = mesh.data->rank(), micro = options.microBatchSize;
  const int sp = mesh.sequence->size(), spRank = mesh.sequence->rank();
  int64_t count = data.numSamples();
  if (options.maxBatches > 0) count = std::min(count, options.maxBatches * micro * dp);
  const int64_t seq = data.seqLen();
  EvalResult result;
  result.samples = count;
  const at::Device device = model.device();
  std::vector<std::string> kinds{"logprobs"};
  if (options.entropy) kinds.push_back("entropy");
  if (options.reference) kinds.push_back("kl");
  for (const auto& kind : kinds)
    if (options.perToken)
      result.perToken[kind] = at::zeros({count, seq}, at::TensorOptions().dtype(at::kFloat).device(device));
  // Sums over this rank's tokens: -logprobs, entropy, KL; and the labels that count.
  at::Tensor sums = at::zeros({4}, at::TensorOptions().dtype(at::kDouble).device(device));
  const int64_t share = seq / sp;
  // Every rank runs the same number of forward passes (ZeRO-3 gathers parameters collectively in
  // each): a rank whose share ran out repeats sample 0 and discards the result.
  for (int64_t round = 0; round * micro * dp < count; ++round) {
    const int64_t first = (round * dp + dpRank) * micro;
    std::vector<int64_t> samples;
    for (int64_t i = first; i < std::min(count, first + micro); ++i) samples.push_back(i);
    const bool idle = samples.empty();
    if (idle) samples.push_back(0);
    const TokenBatch batch = data.batch(samples, options.packDocuments, spRank, sp);
    const at::Tensor inputs = batch.inputs.to(device), labels = batch.labels.to(device);
    const TokenLayout layout = batch.layout.to(device);
    at::Tensor logits = model.logits(inputs, layout);
    at::Tensor teacher = options.reference ? options.reference->logits(inputs, layout) : at::Tensor();
    if (idle) continue;
    // Entropy and KL count where the logprob does.
    const at::Tensor counted = (labels.reshape({-1}) != -100).to(at::kFloat);
    const int64_t columns = logits.size(-1);
    at::Tensor flat = logits.view({-1, columns});
    std::map<std::string, at::Tensor> values{{"logprobs", model.tokenLogprobs(flat, labels.reshape({-1}))}};
    if (options.entropy) values["entropy"] = model.tokenEntropy(flat) * counted;
    if (options.reference) values["kl"] = model.tokenKl(flat, teacher.view({-1, columns})) * counted;
    sums[0] -= values["logprobs"].sum().to(at::kDouble);
    if (options.entropy) sums[1] += values["entropy"].sum().to(at::kDouble);
    if (options.reference) sums[2] += values["kl"].sum().to(at::kDouble);
    sums[3] += static_cast<double>(batch.labelsCounted);
    for (auto& [kind, rows] : result.perToken)
      rows.slice(0, first, first + static_cast<int64_t>(samples.size()))
          .slice(1, spRank * share, (spRank + 1) * share)
          .copy_(values[kind].view({-1, share}));
  }
  RETURN_IF_ERROR(comm.allReduce(sums, backends::ReduceOp::kSum)->wait().withContext("eval: summing the loss"));
  // Each row (each share of it, under sequence parallelism) was written by one rank; the others
  // hold zeros there.
  for (auto& [kind, rows] : result.perToken)
    RETURN_IF_ERROR(comm.allReduce(rows, backends::ReduceOp::kSum)->wait().withContext("eval: gathering " + kind));
  const at::Tensor totals = sums.cpu();
  result.tokens = static_cast<int64_t>(totals[3].item<double>());
  const double tokens = result.tokens ? static_cast<double>(result.tokens) : 1.0;
  result.meanLoss = totals[0].item<double>() / tokens;
  result.meanEntropy = totals[1].item<double>() / tokens;
  result.meanKl = totals[2].item<double>() / tokens;
  return result;
}

}  // namespace loom::worker
