#include "worker/torch/parallel/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/torch/parallel/throw_if_error.h"

namespace loom::worker {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int64_t kIgnored = -100;
// fp32 temporaries of at most this many logits at a time (DeepSpeed's vocab_parallel_ops bound).
constexpr int64_t kBlockElements = int64_t(1) << 24;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Autograd keeps a function's non-tensor state in IValues: the shard travels field by field, the
// communicator as its address.
void keepShard(AutogradContext* ctx, const VocabShard& shard) {
  ctx->saved_data["tp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(shard.tp));
  ctx->saved_data["start"] = shard.vocabStart;
  ctx->saved_data["rows"] = shard.blockRows;
}
VocabShard shardOf(AutogradContext* ctx) {
  return VocabShard{.tp = reinterpret_cast<backends::Communicator*>(static_cast<intptr_t>(ctx->saved_data["tp"].toInt())),
                    .vocabStart = ctx->saved_data["start"].toInt(),
                    .blockRows = ctx->saved_data["rows"].toInt()};
}

void reduceOverGroup(const VocabShard& shard, at::Tensor& t, backends::ReduceOp op, const char* what) {
  if (shard.tp && shard.tp->size() > 1) throwIfError(shard.tp->allReduce(t, op)->wait().withContext(what));
}

// Calls fn(rows) for consecutive blocks of rows of `logits` [N, columns].
template <typename Fn>
void forEachBlock(const at::Tensor& logits, const VocabShard& shard, Fn&& fn) {
  const int64_t n = logits.size(0), columns = std::max<int64_t>(1, logits.size(1));
  const int64_t step = shard.blockRows > 0 ? shard.blockRows : std::max<int64_t>(1, kBlockElements / columns);
  for (int64_t start = 0; start < n; start += step) fn(start, std::min(n, start + step));
}

// Each row's maximum and log of its sum of exp(x - max) over the whole vocabulary, for one or two
// logits tensors alike in shape: [k, N] each, from one MAX and one SUM all-reduce. Kept apart
// rather than added into one log-sum-exp: a small normalizer added to a large max rounds away.
struct SoftmaxStatistics {
  at::Tensor max, logSumExp;
};

// The logits in fp32 times `scale` (1 / a softmax temperature), rows [a, b), always a copy: fp32
// logits are saved for backward and may serve another loss.
at::Tensor scaledBlock(const at::Tensor& logits, int64_t a, int64_t b, double scale) {
  at::Tensor block = logits.slice(0, a, b).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  return scale == 1.0 ? block : block.mul_(scale);
}

SoftmaxStatistics softmaxStatistics(const std::vector<at::Tensor>& logits, const VocabShard& shard,
                                    double scale = 1.0) {
  const int64_t n = logits[0].size(0), k = static_cast<int64_t>(logits.size());
  const auto f32 = logits[0].options().dtype(at::kFloat);
  SoftmaxStatistics s{at::empty({k, n}, f32), at::empty({k, n}, f32)};
  for (int64_t i = 0; i < k; ++i)
    forEachBlock(logits[i], shard, [&](int64_t a, int64_t b) {
      at::Tensor max = std::get<0>(logits[i].slice(0, a, b).max(1));
      s.max[i].slice(0, a, b).copy_(scale == 1.0 ? max : max.to(at::kFloat).mul_(scale));
    });
  reduceOverGroup(shard, s.max, backends::ReduceOp::kMax, "vocab-parallel row maximum");
  for (int64_t i = 0; i < k; ++i)
    forEachBlock(logits[i], shard, [&](int64_t a, int64_t b) {
      at::Tensor shifted = scaledBlock(logits[i], a, b, scale) - s.max[i].slice(0, a, b).unsqueeze(1);
      s.logSumExp[i].slice(0, a, b).copy_(shifted.exp_().sum(1));
    });
  reduceOverGroup(shard, s.logSumExp, backends::ReduceOp::kSum, "vocab-parallel row sums");
  s.logSumExp.log_();
  return s;
}

// log softmax of rows [a, b) of `logits` x `scale`, fp32, in a block of its own.
at::Tensor logSoftmaxBlock(const at::Tensor& logits, const at::Tensor& max, const at::Tensor& logSumExp, int64_t a,
                           int64_t b, double scale = 1.0) {
  return scaledBlock(logits, a, b, scale)
      .sub_(max.slice(0, a, b).unsqueeze(1))
      .sub_(logSumExp.slice(0, a, b).unsqueeze(1));
}

// p * values, with 0 where log p is -inf (a masked token contributes nothing, even against an
// infinite value, which would otherwise give 0 * inf = NaN).
at::Tensor weightedByProbabilities(const at::Tensor& logProbs, const at::Tensor& values) {
  return (logProbs.exp() * values).masked_fill_(logProbs == -kInfinity, 0.0);
}

// A row whose logits are all -inf has no softmax: its gradient is zero instead of NaN.
at::Tensor undefinedRows(const at::Tensor& max) { return (max == -kInfinity).unsqueeze(1); }

struct Logprobs : public torch::autograd::Function<Logprobs> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                            const VocabShard* shard) {
    const int64_t columns = logits.size(1);
    SoftmaxStatistics s = softmaxStatistics({logits}, *shard);
    at::Tensor max = s.max[0], logSumExp = s.logSumExp[0];
    at::Tensor valid = labels != kIgnored;
    at::Tensor local = labels - shard->vocabStart;
    at::Tensor mine = valid.logical_and(local >= 0).logical_and(local < columns);
    at::Tensor column = local.clamp(0, columns - 1);
    at::Tensor target = (logits.gather(1, column.unsqueeze(1)).squeeze(1).to(at::kFloat) - max)
                            .masked_fill_(mine.logical_not(), 0.0);
    reduceOverGroup(*shard, target, backends::ReduceOp::kSum, "vocab-parallel target logits");
    keepShard(ctx, *shard);
    ctx->save_for_backward({logits, max, logSumExp, column, mine, valid});
    return (target - logSumExp).masked_fill_(valid.logical_not(), 0.0);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const at::Tensor &logits = v[0], &max = v[1], &logSumExp = v[2], &column = v[3], &mine = v[4], &valid = v[5];
    const VocabShard shard = shardOf(ctx);
    // d log p(label) / dz_j = onehot(label)_j - softmax(z)_j, for the rows that count.
    at::Tensor g = grads[0].to(at::kFloat) * valid.to(at::kFloat);
    at::Tensor hit = (g * mine.to(at::kFloat)).unsqueeze(1);
    at::Tensor zeroRows = valid.logical_not().unsqueeze(1).logical_or(undefinedRows(max));
    at::Tensor out = at::empty_like(logits);
    forEachBlock(logits, shard, [&](int64_t a, int64_t b) {
      at::Tensor block = logSoftmaxBlock(logits, max, logSumExp, a, b).exp_().mul_(-g.slice(0, a, b).unsqueeze(1));
      block.masked_fill_(zeroRows.slice(0, a, b), 0.0);
      block.scatter_add_(1, column.slice(0, a, b).unsqueeze(1), hit.slice(0, a, b));
      out.slice(0, a, b).copy_(block);
    });
    return {out, at::Tensor(), at::Tensor()};
  }
};

struct Entropy : public torch::autograd::Function<Entropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const VocabShard* shard) {
    SoftmaxStatistics s = softmaxStatistics({logits}, *shard);
    at::Tensor max = s.max[0], logSumExp = s.logSumExp[0];
    at::Tensor entropy = at::empty_like(max);
    forEachBlock(logits, *shard, [&](int64_t a, int64_t b) {
      at::Tensor logProbs = logSoftmaxBlock(logits, max, logSumExp, a, b);
      entropy.slice(0, a, b).copy_(weightedByProbabilities(logProbs, logProbs).sum(1).neg_());
    });
    reduceOverGroup(*shard, entropy, backends::ReduceOp::kSum, "vocab-parallel entropy");
    keepShard(ctx, *shard);
    ctx->save_for_backward({logits, max, logSumExp, entropy});
    return entropy.clone();  // a caller may mask it in place
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const at::Tensor &logits = v[0], &max = v[1], &logSumExp = v[2], &entropy = v[3];
    const VocabShard shard = shardOf(ctx);
    at::Tensor g = grads[0].to(at::kFloat).unsqueeze(1);
    at::Tensor undefined = undefinedRows(max);
    at::Tensor out = at::empty_like(logits);
    // dH / dz_j = -p_j (log p_j + H).
    forEachBlock(logits, shard, [&](int64_t a, int64_t b) {
      at::Tensor logProbs = logSoftmaxBlock(logits, max, logSumExp, a, b);
      at::Tensor block = weightedByProbabilities(logProbs, logProbs + entropy.slice(0, a, b).unsqueeze(1));
      out.slice(0, a, b).copy_(block.mul_(-g.slice(0, a, b)).masked_fill_(undefined.slice(0, a, b), 0.0));
    });
    return {out, at::Tensor()};
  }
};

// KL(A || B) weighs the log ratio by A: the teacher for forward KL, the student for reverse.
template <typename T>
std::pair<T, T> klOrder(T student, T teacher, bool reverse) {
  return reverse ? std::pair<T, T>{student, teacher} : std::pair<T, T>{teacher, student};
}

struct KlDivergence : public torch::autograd::Function<KlDivergence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& student, const at::Tensor& teacher, bool reverse,
                            const VocabShard* shard) {
    SoftmaxStatistics s = softmaxStatistics({student, teacher}, *shard);
    at::Tensor kl = at::empty_like(s.max[0]);
    forEachBlock(student, *shard, [&](int64_t a, int64_t b) {
      at::Tensor sl = logSoftmaxBlock(student, s.max[0], s.logSumExp[0], a, b);
      at::Tensor tl = logSoftmaxBlock(teacher, s.max[1], s.logSumExp[1], a, b);
      auto [pa, pb] = klOrder(sl, tl, reverse);
      // Where A has support that B masks out, KL(A || B) is infinite even if p_A underflows to 0.
      at::Tensor terms = weightedByProbabilities(pa, pa - pb)
                             .masked_fill_((pb == -kInfinity).logical_and(pa != -kInfinity), kInfinity);
      kl.slice(0, a, b).copy_(terms.sum(1));
    });
    reduceOverGroup(*shard, kl, backends::ReduceOp::kSum, "vocab-parallel KL divergence");
    keepShard(ctx, *shard);
    ctx->saved_data["reverse"] = reverse;
    ctx->save_for_backward({student, teacher, s.max, s.logSumExp, kl});
    return kl.clone();  // a caller may mask it in place
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const at::Tensor &student = v[0], &teacher = v[1], &max = v[2], &logSumExp = v[3], &kl = v[4];
    const VocabShard shard = shardOf(ctx);
    const bool reverse = ctx->saved_data["reverse"].toBool();
    const bool wantStudent = ctx->needs_input_grad(0), wantTeacher = ctx->needs_input_grad(1);
    at::Tensor gradStudent = wantStudent ? at::empty_like(student) : at::Tensor();
    at::Tensor gradTeacher = wantTeacher ? at::empty_like(teacher) : at::Tensor();
    auto [gradA, gradB] = klOrder(&gradStudent, &gradTeacher, reverse);
    at::Tensor g = grads[0].to(at::kFloat).unsqueeze(1);
    // KL is undefined where either distribution is: both sides get zero gradient there.
    at::Tensor undefined = undefinedRows(max[0]).logical_or(undefinedRows(max[1]));
    forEachBlock(student, shard, [&](int64_t a, int64_t b) {
      at::Tensor sl = logSoftmaxBlock(student, max[0], logSumExp[0], a, b);
      at::Tensor tl = logSoftmaxBlock(teacher, max[1], logSumExp[1], a, b);
      auto [la, lb] = klOrder(sl, tl, reverse);
      const at::Tensor gBlock = g.slice(0, a, b), undefinedBlock = undefined.slice(0, a, b);
      // For KL(A || B): dKL/dz_A = p_A (log p_A - log p_B - KL), dKL/dz_B = p_B - p_A.
      if (gradA->defined()) {
        at::Tensor ratio = la - lb - kl.slice(0, a, b).unsqueeze(1);
        gradA->slice(0, a, b).copy_(weightedByProbabilities(la, ratio).mul_(gBlock).masked_fill_(undefinedBlock, 0.0));
      }
      if (gradB->defined())
        gradB->slice(0, a, b).copy_((lb.exp() - la.exp()).mul_(gBlock).masked_fill_(undefinedBlock, 0.0));
    });
    return {gradStudent, gradTeacher, at::Tensor(), at::Tensor()};
  }
};


// The generalized JSD's pointwise terms of one block and, per vocabulary entry, the derivative of
// its term by the student's log-probability s_v (the term of entry v depends on s_v alone):
//   beta 0, p_t (t - s):                  -p_t
//   beta 1, p_s (s - t):                  p_s (s - t + 1)
//   else, beta p_t (t - m) + (1 - beta) p_s (s - m), m = log((1 - beta) p_s + beta p_t):
//                                         (1 - beta) p_s (s - m)
// A capped term passes no gradient. Through the log softmax, dJ/dz_v = a_v - p_s,v sum_u a_u.
struct JsdTerms {
  at::Tensor pointwise, slope;
};

JsdTerms jsdTerms(const at::Tensor& s, const at::Tensor& t, const JsdOptions& o, bool withSlope) {
  JsdTerms out;
  if (o.beta == 0.0) {
    out.pointwise = weightedByProbabilities(t, t - s);
    if (withSlope) out.slope = t.exp().neg_();
  } else if (o.beta == 1.0) {
    out.pointwise = weightedByProbabilities(s, s - t);
    if (withSlope) out.slope = weightedByProbabilities(s, s - t + 1.0);
  } else {
    const at::Tensor m = at::logaddexp(s + static_cast<float>(std::log1p(-o.beta)), t + static_cast<float>(std::log(o.beta)));
    out.pointwise = weightedByProbabilities(t, t - m).mul_(o.beta).add_(weightedByProbabilities(s, s - m).mul_(1.0 - o.beta));
    if (withSlope) out.slope = weightedByProbabilities(s, s - m).mul_(1.0 - o.beta);
  }
  if (o.pointwiseClip >= 0) {
    if (withSlope) out.slope.masked_fill_(out.pointwise > o.pointwiseClip, 0.0);
    out.pointwise.clamp_max_(o.pointwiseClip);
  }
  return out;
}

struct GeneralizedJsd : public torch::autograd::Function<GeneralizedJsd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& student, const at::Tensor& teacher,
                            const JsdOptions* options, const VocabShard* shard) {
    const double scale = 1.0 / options->temperature;
    SoftmaxStatistics s = softmaxStatistics({student, teacher}, *shard, scale);
    // Per row, the divergence and the sum of the slopes its backward needs: one all-reduce.
    at::Tensor sums = at::empty({2, student.size(0)}, s.max.options());
    forEachBlock(student, *shard, [&](int64_t a, int64_t b) {
      JsdTerms terms = jsdTerms(logSoftmaxBlock(student, s.max[0], s.logSumExp[0], a, b, scale),
                                logSoftmaxBlock(teacher, s.max[1], s.logSumExp[1], a, b, scale), *options, true);
      sums[0].slice(0, a, b).copy_(terms.pointwise.sum(1));
      sums[1].slice(0, a, b).copy_(terms.slope.sum(1));
    });
    reduceOverGroup(*shard, sums, backends::ReduceOp::kSum, "vocab-parallel generalized JSD");
    keepShard(ctx, *shard);
    ctx->saved_data["beta"] = options->beta;
    ctx->saved_data["temperature"] = options->temperature;
    ctx->saved_data["clip"] = options->pointwiseClip;
    ctx->save_for_backward({student, teacher, s.max, s.logSumExp, sums[1]});
    return sums[0].clone();  // a caller may mask it in place
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto v = ctx->get_saved_variables();
    const at::Tensor &student = v[0], &teacher = v[1], &max = v[2], &logSumExp = v[3], &slopeSum = v[4];
    const VocabShard shard = shardOf(ctx);
    const JsdOptions o{.beta = ctx->saved_data["beta"].toDouble(),
                       .temperature = ctx->saved_data["temperature"].toDouble(),
                       .pointwiseClip = ctx->saved_data["clip"].toDouble()};
    const double scale = 1.0 / o.temperature;
    at::Tensor g = grads[0].to(at::kFloat).mul(scale).unsqueeze(1);
    at::Tensor undefined = undefinedRows(max[0]).logical_or(undefinedRows(max[1]));
    at::Tensor out = at::empty_like(student);
    forEachBlock(student, shard, [&](int64_t a, int64_t b) {
      at::Tensor s = logSoftmaxBlock(student, max[0], logSumExp[0], a, b, scale);
      JsdTerms terms = jsdTerms(s, logSoftmaxBlock(teacher, max[1], logSumExp[1], a, b, scale), o, true);
      at::Tensor block = terms.slope.sub_(s.exp_().mul_(slopeSum.slice(0, a, b).unsqueeze(1)));
      out.slice(0, a, b).copy_(block.mul_(g.slice(0, a, b)).masked_fill_(undefined.slice(0, a, b), 0.0));
    });
    return {out, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor vocabParallelLogprobs(const at::Tensor& logits, const at::Tensor& labels, const VocabShard& shard) {
  return Logprobs::apply(logits, labels, &shard);
}

at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& labels, const VocabShard& shard) {
  // The mean of -log p(label) over the rows that count; ignored rows are 0 and get no gradient.
  const at::Tensor count = (labels != kIgnored).sum().to(at::kFloat).clamp_min(1);
  return Logprobs::apply(logits, labels, &shard).sum().neg() / count;
}

at::Tensor vocabParallelEntropy(const at::Tensor& logits, const VocabShard& shard) {
  return Entropy::apply(logits, &shard);
}

at::Tensor vocabParallelKl(const at::Tensor& student, const at::Tensor& teacher, bool reverse,
                           const VocabShard& shard) {
  return KlDivergence::apply(student, teacher, reverse, &shard);
}

at::Tensor vocabParallelGeneralizedJsd(const at::Tensor& student, const at::Tensor& teacher, const JsdOptions& options,
                                       const VocabShard& shard) {
  return GeneralizedJsd::apply(student, teacher.detach(), &options, &shard);
}

}  // namespace loom::worker
