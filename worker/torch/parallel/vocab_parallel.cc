#include "worker/torch/parallel/vocab_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/torch/zero/zero_buffers.h"

namespace loom::worker {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int64_t kIgnored = -100;

// What a row's softmax over the whole vocabulary needs, from this rank's columns and two small
// all-reduces: the row's maximum, log of its sum of exp(x - max), and its target's x - max.
struct RowStatistics {
  at::Tensor max;        // [N]
  at::Tensor logSumExp;  // [N], of x - max
  at::Tensor target;     // [N], x[label] - max; 0 where ignored
  at::Tensor valid;      // [N] bool: label not -100
  at::Tensor mine;       // [N] bool: the label's column is this rank's
  at::Tensor column;     // [N] the label's local column (0 where not mine)
};

RowStatistics rowStatistics(const at::Tensor& x, const at::Tensor& labels, int64_t vocabStart, backends::Communicator& tp) {
  RowStatistics s;
  const int64_t columns = x.size(1);
  s.max = std::get<0>(x.max(1));
  throwIfError(tp.allReduce(s.max, backends::ReduceOp::kMax)->wait().withContext("vocab-parallel row maximum"));
  at::Tensor shifted = x - s.max.unsqueeze(1);
  s.valid = labels != kIgnored;
  at::Tensor local = labels - vocabStart;
  s.mine = s.valid.logical_and(local >= 0).logical_and(local < columns);
  s.column = local.masked_fill(s.mine.logical_not(), 0);
  at::Tensor target = shifted.gather(1, s.column.unsqueeze(1)).squeeze(1).masked_fill(s.mine.logical_not(), 0);
  at::Tensor sums = at::stack({shifted.exp().sum(1), target});
  throwIfError(tp.allReduce(sums, backends::ReduceOp::kSum)->wait().withContext("vocab-parallel row sums"));
  s.logSumExp = sums[0].log();
  s.target = sums[1];
  return s;
}

// softmax(x) - onehot(label) on this rank's columns, the gradient of -log p(label) in x.
at::Tensor softmaxMinusTarget(const at::Tensor& x, const at::Tensor& max, const at::Tensor& logSumExp,
                              const at::Tensor& mine, const at::Tensor& column) {
  at::Tensor g = (x - (max + logSumExp).unsqueeze(1)).exp();
  at::Tensor hit = mine.to(g.scalar_type());
  g.scatter_add_(1, column.unsqueeze(1), -hit.unsqueeze(1));
  return g;
}

// Saved for backward, in this order: logits, max, logSumExp, valid, mine, column[, count].
void saveStatistics(AutogradContext* ctx, const at::Tensor& logits, const RowStatistics& s, const at::Tensor& count = {}) {
  ctx->save_for_backward({logits, s.max, s.logSumExp, s.valid, s.mine, s.column, count});
}

struct CrossEntropy : public torch::autograd::Function<CrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                            int64_t vocabStart, backends::Communicator* tp) {
    at::Tensor x = logits.to(at::kFloat);
    RowStatistics s = rowStatistics(x, labels, vocabStart, *tp);
    const at::Tensor count = s.valid.sum().clamp_min(1).to(at::kFloat);
    saveStatistics(ctx, logits, s, count);
    return ((s.logSumExp - s.target) * s.valid.to(at::kFloat)).sum() / count;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const at::Tensor& logits = v[0];
    at::Tensor g = softmaxMinusTarget(logits.to(at::kFloat), v[1], v[2], v[4], v[5]);
    const at::Tensor scale = v[3].to(at::kFloat).unsqueeze(1) * (grads[0] / v[6]);
    return {(g * scale).to(logits.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct Logprobs : public torch::autograd::Function<Logprobs> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                            int64_t vocabStart, backends::Communicator* tp) {
    at::Tensor x = logits.to(at::kFloat);
    RowStatistics s = rowStatistics(x, labels, vocabStart, *tp);
    saveStatistics(ctx, logits, s);
    return ((s.target - s.logSumExp) * s.valid.to(at::kFloat));
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const at::Tensor& logits = v[0];
    // d log p(label) / dx = onehot - softmax.
    at::Tensor g = softmaxMinusTarget(logits.to(at::kFloat), v[1], v[2], v[4], v[5]).neg_();
    const at::Tensor scale = (grads[0] * v[3].to(at::kFloat)).unsqueeze(1);
    return {(g * scale).to(logits.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& labels, int64_t vocabStart,
                                     backends::Communicator& tp) {
  return CrossEntropy::apply(logits, labels, vocabStart, &tp);
}

at::Tensor vocabParallelLogprobs(const at::Tensor& logits, const at::Tensor& labels, int64_t vocabStart,
                                 backends::Communicator& tp) {
  return Logprobs::apply(logits, labels, vocabStart, &tp);
}

}  // namespace loom::worker
