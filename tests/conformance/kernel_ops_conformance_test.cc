// Every layer and vocabulary op of the CPU plugin against the libtorch reference, both through
// the plugin ABI, on fresh random inputs of several shapes, in fp32 and bf16, on every
// instruction-set path this processor has and on both kinds of threads.
#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kernels/reference/reference_ops.h"
#include "tests/catch.h"
#include "tests/conformance/kernel_conformance.h"

using namespace loom::testing;

namespace {

constexpr loom_dtype kDtypes[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16};

double maxAbs(const at::Tensor& t) { return t.numel() ? t.abs().max().item<double>() : 0.0; }

}  // namespace

TEST_CASE("rms_norm forward and backward match the reference", "[kernels]") {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 7}, {5, 33}, {17, 256}, {4, 4096}};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (auto [rows, dim] : shapes) {
        const std::string what = fmt::format("rms_norm {} {} [{}, {}]", setup.label(), dtypeName(dtype), rows, dim);
        const double eps = 1e-6;
        const at::Tensor x = randomInput({rows, dim}, dtype), w = randomInput({dim}, dtype),
                         dy = randomInput({rows, dim}, dtype);
        auto forward = [&](const loom_kernel_table& t) {
          at::Tensor y = at::empty_like(x), rstd = at::empty({rows}, at::kFloat);
          REQUIRE(t.rms_norm_forward(dtype, x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), rows, dim,
                                     eps, nullptr) == LOOM_KERNEL_OK);
          return std::make_pair(y, rstd);
        };
        auto [y, rstd] = forward(cpuPlugin());
        auto [yRef, rstdRef] = forward(referenceTable());
        requireClose(y, yRef, tolerance(dtype, 0.0), what + " y");
        requireClose(rstd, rstdRef, tolerance(LOOM_DTYPE_F32, 0.0), what + " rstd");

        // With and without the forward's statistics.
        for (bool withRstd : {true, false}) {
          auto backward = [&](const loom_kernel_table& t) {
            at::Tensor dx = at::empty_like(x), dw = at::empty({dim}, at::kFloat);
            REQUIRE(t.rms_norm_backward(dtype, x.data_ptr(), w.data_ptr(), dy.data_ptr(),
                                        withRstd ? rstdRef.data_ptr<float>() : nullptr, dx.data_ptr(),
                                        dw.data_ptr<float>(), rows, dim, eps, nullptr) == LOOM_KERNEL_OK);
            return std::make_pair(dx, dw);
          };
          auto [dx, dw] = backward(cpuPlugin());
          auto [dxRef, dwRef] = backward(referenceTable());
          // dx = r (g - h mean(g h)) and dweight = sum over rows of dy h both cancel: their
          // rounding error is relative to the terms' size, |g| r and the sum of |dy h|.
          const at::Tensor h = x.to(at::kFloat) * rstdRef.unsqueeze(1);
          const double dxTerms = maxAbs(dy.to(at::kFloat) * w.to(at::kFloat)) * maxAbs(rstdRef);
          const double dwTerms = maxAbs((dy.to(at::kFloat) * h).abs().sum(0));
          requireClose(dx, dxRef, tolerance(dtype, dxTerms), what + (withRstd ? " dx" : " dx (rstd recomputed)"));
          requireClose(dw, dwRef, tolerance(dtype, dwTerms), what + " dweight");
        }
      }
    }
  }
}

TEST_CASE("add_rms_norm matches a torch add and the reference rms_norm of the sum", "[kernels]") {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 7}, {5, 33}, {17, 256}, {4, 4096}};
  const double eps = 1e-6;
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (auto [rows, dim] : shapes) {
        const std::string what = fmt::format("add_rms_norm {} {} [{}, {}]", setup.label(), dtypeName(dtype), rows, dim);
        const at::Tensor x = randomInput({rows, dim}, dtype), residual = randomInput({rows, dim}, dtype),
                         w = randomInput({dim}, dtype);
        at::Tensor sum = at::empty_like(x), y = at::empty_like(x);
        REQUIRE(cpuPlugin().add_rms_norm(dtype, x.data_ptr(), residual.data_ptr(), w.data_ptr(), sum.data_ptr(),
                                         y.data_ptr(), rows, dim, eps, nullptr) == LOOM_KERNEL_OK);
        const at::Tensor sumRef = x + residual;
        CHECK(at::equal(sum, sumRef));
        requireClose(y, loom::kernels::reference::rmsNormForward(sumRef, w, eps), tolerance(dtype, 0.0), what + " y");
      }
    }
  }
  // A call without its tensors is an error naming the op.
  CHECK(cpuPlugin().add_rms_norm(LOOM_DTYPE_F32, nullptr, nullptr, nullptr, nullptr, nullptr, 2, 4, 1e-6, nullptr) ==
        LOOM_KERNEL_INVALID_ARGUMENT);
  CHECK(std::string(cpuPlugin().last_error()).find("add_rms_norm") == 0);
}

TEST_CASE("rope forward and backward match the reference", "[kernels]") {
  struct Shape {
    int64_t batch, qHeads, kHeads, seq, headDim;
    bool perBatchCos;
  };
  const Shape shapes[] = {{1, 1, 1, 1, 2, false},
                          {2, 4, 2, 5, 8, false},
                          {1, 3, 1, 17, 66, true},
                          {2, 8, 8, 33, 128, true},
                          {1, 2, 1, 9, 64, false}};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (const Shape& s : shapes) {
        const std::string what =
            fmt::format("rope {} {} q [{}, {}, {}, {}] k heads {}{}", setup.label(), dtypeName(dtype), s.batch,
                        s.qHeads, s.seq, s.headDim, s.kHeads, s.perBatchCos ? ", cos per batch" : "");
        const at::Tensor q = randomInput({s.batch, s.qHeads, s.seq, s.headDim}, dtype);
        const at::Tensor k = randomInput({s.batch, s.kHeads, s.seq, s.headDim}, dtype);
        // Real tables: angles per position and frequency, the two halves equal (as HF builds
        // them); the per-batch variant shifts positions per sequence.
        const int64_t tableBatch = s.perBatchCos ? s.batch : 1;
        const at::Tensor angles = at::rand({tableBatch, s.seq, s.headDim / 2}) * 10.0;
        const at::Tensor full = at::cat({angles, angles}, -1);
        const at::Tensor cos = (s.perBatchCos ? full.cos() : full.cos()[0]).contiguous().to(q.scalar_type());
        const at::Tensor sin = (s.perBatchCos ? full.sin() : full.sin()[0]).contiguous().to(q.scalar_type());
        const int64_t stride = s.perBatchCos ? s.seq * s.headDim : 0;
        for (bool backward : {false, true}) {
          auto run = [&](const loom_kernel_table& t) {
            at::Tensor qo = q.clone(), ko = k.clone();
            auto fn = backward ? t.rope_backward : t.rope_forward;
            REQUIRE(fn(dtype, qo.data_ptr(), ko.data_ptr(), cos.data_ptr(), sin.data_ptr(), s.batch, s.qHeads, s.kHeads,
                       s.seq, s.headDim, stride, nullptr) == LOOM_KERNEL_OK);
            return std::make_pair(qo, ko);
          };
          auto [qo, ko] = run(cpuPlugin());
          auto [qRef, kRef] = run(referenceTable());
          // x1 cos - x2 sin cancels: error relative to the largest |x|.
          const std::string dir = backward ? " backward" : " forward";
          requireClose(qo, qRef, tolerance(dtype, std::max(maxAbs(q.to(at::kFloat)), 1.0)), what + dir + " q");
          requireClose(ko, kRef, tolerance(dtype, std::max(maxAbs(k.to(at::kFloat)), 1.0)), what + dir + " k");
        }
      }
    }
  }
}

TEST_CASE("swiglu forward and backward match the reference", "[kernels]") {
  const int64_t sizes[] = {1, 15, 17, 1000, 100003};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (int64_t n : sizes) {
        const std::string what = fmt::format("swiglu {} {} [{}]", setup.label(), dtypeName(dtype), n);
        const at::Tensor gate = randomInput({n}, dtype, 3.0), up = randomInput({n}, dtype),
                         dout = randomInput({n}, dtype);
        auto forward = [&](const loom_kernel_table& t) {
          at::Tensor out = at::empty_like(gate);
          REQUIRE(t.swiglu_forward(dtype, gate.data_ptr(), up.data_ptr(), out.data_ptr(), n, nullptr) ==
                  LOOM_KERNEL_OK);
          return out;
        };
        requireClose(forward(cpuPlugin()), forward(referenceTable()), tolerance(dtype, 0.0), what + " out");
        auto backward = [&](const loom_kernel_table& t) {
          at::Tensor dg = at::empty_like(gate), du = at::empty_like(up);
          REQUIRE(t.swiglu_backward(dtype, gate.data_ptr(), up.data_ptr(), dout.data_ptr(), dg.data_ptr(),
                                    du.data_ptr(), n, nullptr) == LOOM_KERNEL_OK);
          return std::make_pair(dg, du);
        };
        auto [dg, du] = backward(cpuPlugin());
        auto [dgRef, duRef] = backward(referenceTable());
        // silu' = sig (1 + g (1 - sig)) passes through 0 near g = -1.28: error relative to the
        // size of its terms, |dout up| (1 + |g|).
        const double dgTerms = maxAbs(dout.to(at::kFloat) * up.to(at::kFloat)) * (1.0 + maxAbs(gate.to(at::kFloat)));
        requireClose(dg, dgRef, tolerance(dtype, dgTerms), what + " dgate");
        requireClose(du, duRef, tolerance(dtype, 0.0), what + " dup");
      }
    }
  }
}

namespace {

// Labels in range, every fifth -100 (ignored by cross-entropy).
at::Tensor randomLabels(int64_t rows, int64_t vocab, bool withIgnored) {
  at::Tensor labels = at::randint(vocab, {rows}, at::kLong);
  if (withIgnored)
    for (int64_t r = 2; r < rows; r += 5) labels[r] = -100;
  return labels;
}

void checkVocabOps(const PluginSetup& setup, loom_dtype dtype, int64_t rows, int64_t vocab) {
  const std::string what = fmt::format("{} {} [{}, {}]", setup.label(), dtypeName(dtype), rows, vocab);
  const at::Tensor logits = randomInput({rows, vocab}, dtype, 3.0);
  const at::Tensor other = (logits.to(at::kFloat) + at::randn({rows, vocab})).to(logits.scalar_type());
  const at::Tensor labels = randomLabels(rows, vocab, true), inRange = randomLabels(rows, vocab, false);
  const at::Tensor dloss = at::randn({rows});
  // Results are differences of log-sum-exps: their error is relative to lse's size.
  const double lseScale = std::log(static_cast<double>(vocab)) + maxAbs(logits.to(at::kFloat)) + 1.0;
  const Tolerance tol = tolerance(dtype, lseScale);

  auto forward = [&](const loom_kernel_table& t) {
    at::Tensor loss = at::empty({rows}), lse = at::empty({rows});
    REQUIRE(t.cross_entropy_forward(dtype, logits.data_ptr(), labels.data_ptr<int64_t>(), rows, vocab, -100,
                                    loss.data_ptr<float>(), lse.data_ptr<float>(), nullptr) == LOOM_KERNEL_OK);
    return std::make_pair(loss, lse);
  };
  auto [loss, lse] = forward(cpuPlugin());
  auto [lossRef, lseRef] = forward(referenceTable());
  requireClose(loss, lossRef, tol, "cross_entropy_forward loss " + what);
  const at::Tensor kept = labels != -100;
  requireClose(lse.masked_select(kept), lseRef.masked_select(kept), tol, "cross_entropy_forward lse " + what);

  for (bool withLse : {true, false}) {
    auto backward = [&](const loom_kernel_table& t) {
      at::Tensor d = at::empty_like(logits);
      REQUIRE(t.cross_entropy_backward(dtype, logits.data_ptr(), labels.data_ptr<int64_t>(),
                                       withLse ? lseRef.data_ptr<float>() : nullptr, dloss.data_ptr<float>(),
                                       d.data_ptr(), rows, vocab, -100, nullptr) == LOOM_KERNEL_OK);
      return d;
    };
    // p = exp(x - lse) carries the rounding of x - lse, relative to |x| + |lse| (1 ulp of lse ~ 10
    // is 1e-6 of p already), and p - 1 at the label cancels when p ~ 1: terms |p| lseScale + |dloss|.
    const at::Tensor expected = backward(referenceTable());
    const at::Tensor terms = expected.to(at::kFloat).abs() * lseScale + dloss.abs().unsqueeze(1);
    requireClose(backward(cpuPlugin()), expected, tolerance(dtype, 0.0),
                 "cross_entropy_backward " + what + (withLse ? "" : " (lse recomputed)"), terms);
  }

  auto perRow = [&](const loom_kernel_table& t, int op) {
    at::Tensor out = at::empty({rows});
    int rc = LOOM_KERNEL_INTERNAL;
    if (op == 0)
      rc = t.logprobs(dtype, logits.data_ptr(), inRange.data_ptr<int64_t>(), rows, vocab, out.data_ptr<float>(),
                      nullptr);
    if (op == 1) rc = t.entropy(dtype, logits.data_ptr(), rows, vocab, out.data_ptr<float>(), nullptr);
    if (op == 2)
      rc = t.kl_divergence(dtype, logits.data_ptr(), other.data_ptr(), rows, vocab, out.data_ptr<float>(), nullptr);
    REQUIRE(rc == LOOM_KERNEL_OK);
    return out;
  };
  requireClose(perRow(cpuPlugin(), 0), perRow(referenceTable(), 0), tol, "logprobs " + what);
  requireClose(perRow(cpuPlugin(), 1), perRow(referenceTable(), 1), tol, "entropy " + what);
  requireClose(perRow(cpuPlugin(), 2), perRow(referenceTable(), 2), tol, "kl_divergence " + what);
}

}  // namespace

TEST_CASE("cross_entropy, logprobs, entropy and KL over the vocabulary match the reference", "[kernels]") {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 7}, {17, 1000}, {6, 32003}};
  const auto setups = pluginSetups();
  for (const PluginSetup& setup : setups) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes)
      for (auto [rows, vocab] : shapes) checkVocabOps(setup, dtype, rows, vocab);
  }
  // More rows than one chunk of the reference holds (kVocabChunkBytes): the plugin streams rows,
  // the reference goes chunk by chunk, and both must agree across the chunk border.
  configurePlugin(setups.front());
  checkVocabOps(setups.front(), LOOM_DTYPE_F32, 530, 32000);
}

TEST_CASE("greedy_logprobs picks as torch.argmax does, with log_softmax at the pick", "[kernels]") {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 8}, {17, 1000}, {6, 32003}};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (auto [rows, vocab] : shapes) {
        const GreedyCase c = greedyCase(rows, vocab, dtype);
        at::Tensor tokens = at::empty({rows}, at::kLong), logprobs = at::empty({rows});
        REQUIRE(cpuPlugin().greedy_logprobs(dtype, c.logits.data_ptr(), rows, vocab, tokens.data_ptr<int64_t>(),
                                            logprobs.data_ptr<float>(), nullptr) == LOOM_KERNEL_OK);
        checkGreedy(c, tokens, logprobs,
                    fmt::format("greedy_logprobs {} {} [{}, {}]", setup.label(), dtypeName(dtype), rows, vocab));
      }
    }
  }
}

TEST_CASE("a label outside the vocabulary is an error before anything is written", "[kernels]") {
  const at::Tensor logits = at::randn({2, 10});
  const at::Tensor labels = at::tensor({3, 10}, at::kLong);
  at::Tensor loss = at::full({2}, 7.0f);
  const loom_kernel_table& t = cpuPlugin();
  REQUIRE(t.cross_entropy_forward(LOOM_DTYPE_F32, logits.data_ptr(), labels.data_ptr<int64_t>(), 2, 10, -100,
                                  loss.data_ptr<float>(), nullptr, nullptr) == LOOM_KERNEL_INVALID_ARGUMENT);
  CHECK(std::string(t.last_error()).find("label 10 of row 1") != std::string::npos);
  CHECK(loss[0].item<float>() == 7.0f);
}

TEST_CASE("clamped swiglu forward and backward match the reference", "[kernels]") {
  const int64_t sizes[] = {1, 17, 1000, 100003};
  const double alpha = 1.702, limit = 7.0;  // GPT-OSS's
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (int64_t n : sizes) {
        const std::string what = fmt::format("clamped swiglu {} {} [{}]", setup.label(), dtypeName(dtype), n);
        // Wide enough that both clamps bite: |x| > 7 for about 1 element in 4.
        const at::Tensor gate = randomInput({n}, dtype, 6.0), up = randomInput({n}, dtype, 6.0),
                         dout = randomInput({n}, dtype);
        auto forward = [&](const loom_kernel_table& t) {
          at::Tensor out = at::empty_like(gate);
          REQUIRE(t.clamped_swiglu_forward(dtype, gate.data_ptr(), up.data_ptr(), out.data_ptr(), n, alpha, limit,
                                           nullptr) == LOOM_KERNEL_OK);
          return out;
        };
        requireClose(forward(cpuPlugin()), forward(referenceTable()), tolerance(dtype, 0.0), what + " out");
        auto backward = [&](const loom_kernel_table& t) {
          at::Tensor dg = at::empty_like(gate), du = at::empty_like(up);
          REQUIRE(t.clamped_swiglu_backward(dtype, gate.data_ptr(), up.data_ptr(), dout.data_ptr(), dg.data_ptr(),
                                            du.data_ptr(), n, alpha, limit, nullptr) == LOOM_KERNEL_OK);
          return std::make_pair(dg, du);
        };
        auto [dg, du] = backward(cpuPlugin());
        auto [dgRef, duRef] = backward(referenceTable());
        // d(g sigmoid(a g)) = s (1 + a g (1 - s)) passes through 0: error relative to its terms,
        // |dout| (|u| + 1) (1 + a |g|), at most |dout| (limit + 1) (1 + a limit).
        const double dgTerms = maxAbs(dout.to(at::kFloat)) * (limit + 1.0) * (1.0 + alpha * limit);
        requireClose(dg, dgRef, tolerance(dtype, dgTerms), what + " dgate");
        requireClose(du, duRef, tolerance(dtype, maxAbs(dout.to(at::kFloat)) * limit), what + " dup");
        // The clamps pass no gradient: where up was clamped, dup is exactly 0.
        const at::Tensor clamped = up.to(at::kFloat).abs() > limit;
        CHECK(du.to(at::kFloat).masked_select(clamped).abs().sum().item<double>() == 0.0);
      }
    }
  }
}

TEST_CASE("masked softmax forward and backward match the reference - a fully masked row is 0", "[kernels]") {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 17}, {8, 129}, {4, 1000}};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (auto [rows, cols] : shapes) {
        for (bool masked : {false, true}) {
          const std::string what = fmt::format("masked softmax {} {} [{}, {}]{}", setup.label(), dtypeName(dtype),
                                               rows, cols, masked ? " with a mask" : "");
          const double scale = 0.125;
          const at::Tensor x = randomInput({rows, cols}, dtype, 20.0), dy = randomInput({rows, cols}, dtype);
          at::Tensor mask = (at::rand({rows, cols}) > 0.3).to(at::kByte);
          if (rows > 1) mask[1].zero_();  // nothing left in row 1
          const uint8_t* maskPtr = masked ? mask.data_ptr<uint8_t>() : nullptr;
          auto forward = [&](const loom_kernel_table& t) {
            at::Tensor y = at::empty_like(x);
            REQUIRE(t.masked_softmax_forward(dtype, x.data_ptr(), maskPtr, y.data_ptr(), rows, cols, scale, nullptr) ==
                    LOOM_KERNEL_OK);
            return y;
          };
          const at::Tensor y = forward(cpuPlugin()), yRef = forward(referenceTable());
          // exp(z) carries its argument's rounding, |z| 2^-24 relative (z = scale x - max, up to
          // ~20 here: 1.2e-6), and libtorch's fp32 normalizer its sum's, about log2(cols) 2^-24.
          // Each element's bound |y| (|z| + log2(cols) + 1) 2^-24 is rtol * terms.
          const at::Tensor z = x.to(at::kFloat) * scale - (x.to(at::kFloat) * scale).amax(-1, true);
          const at::Tensor expTerms = yRef.to(at::kFloat).abs() * (z.abs() + std::log2(double(cols)) + 1) *
                                      (std::ldexp(1.0, -24) / 1e-6);
          requireClose(y, yRef, tolerance(dtype, 0.0), what + " y", expTerms);
          if (masked && rows > 1) CHECK(y[1].to(at::kFloat).abs().sum().item<double>() == 0.0);
          if (masked) CHECK(y.to(at::kFloat).masked_select(mask.logical_not()).abs().sum().item<double>() == 0.0);

          auto backward = [&](const loom_kernel_table& t) {
            at::Tensor dx = at::empty_like(x);
            REQUIRE(t.masked_softmax_backward(dtype, yRef.data_ptr(), dy.data_ptr(), dx.data_ptr(), rows, cols, scale,
                                              nullptr) == LOOM_KERNEL_OK);
            return dx;
          };
          // dx = scale y (dy - sum(dy y)) cancels: error relative to scale |y| |dy| terms.
          const double terms = scale * maxAbs(dy.to(at::kFloat)) * 2.0;
          const at::Tensor dx = backward(cpuPlugin()), dxRef = backward(referenceTable());
          requireClose(dx, dxRef, tolerance(dtype, terms), what + " dx");
          if (dtype == LOOM_DTYPE_F32) {
            // The reference's closed form against autograd through its forward.
            at::Tensor leaf = x.clone().requires_grad_(true);
            at::Tensor out = loom::kernels::reference::maskedSoftmaxForward(
                leaf, masked ? mask.to(at::kBool) : at::Tensor(), scale);
            out.backward(dy);
            requireClose(dxRef, leaf.grad(), tolerance(dtype, terms), what + " dx, closed form vs autograd");
          }
        }
      }
    }
  }
}

TEST_CASE("paged decode attention matches attention over the gathered keys and values", "[kernels]") {
  struct Shape {
    int64_t seqs, heads, kvHeads, dim, blockSize, maxContext, window;
  };
  const Shape shapes[] = {{3, 8, 2, 64, 16, 300, 0}, {5, 4, 4, 16, 4, 40, 0}, {4, 6, 2, 32, 8, 50, 8}};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (const Shape& s : shapes) {
        const std::string what = fmt::format("paged decode {} {} [{} seqs, {}/{} heads, dim {}, window {}]",
                                             setup.label(), dtypeName(dtype), s.seqs, s.heads, s.kvHeads, s.dim,
                                             s.window);
        const at::Tensor lengths = at::randint(1, s.maxContext + 1, {s.seqs}, at::kLong);
        lengths[0] = 1;
        const int64_t maxBlocks = (s.maxContext + s.blockSize - 1) / s.blockSize;
        const int64_t numBlocks = s.seqs * maxBlocks + 2;
        const at::Tensor tables = at::randperm(numBlocks, at::kLong).narrow(0, 0, s.seqs * maxBlocks)
                                      .reshape({s.seqs, maxBlocks}).contiguous();
        const at::Tensor keys = randomInput({numBlocks, s.blockSize, s.kvHeads, s.dim}, dtype);
        const at::Tensor values = randomInput({numBlocks, s.blockSize, s.kvHeads, s.dim}, dtype);
        const at::Tensor q = randomInput({s.seqs, s.heads, s.dim}, dtype);
        at::Tensor out = at::empty_like(q);
        const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
        REQUIRE(cpuPlugin().paged_attention_decode(dtype, q.data_ptr(), keys.data_ptr(), values.data_ptr(),
                                                   tables.data_ptr<int64_t>(), lengths.data_ptr<int64_t>(),
                                                   out.data_ptr(), s.seqs, s.heads, s.kvHeads, s.dim, s.blockSize,
                                                   maxBlocks, scale, s.window, nullptr) == LOOM_KERNEL_OK);
        for (int64_t i = 0; i < s.seqs; ++i) {
          const int64_t context = lengths[i].item<int64_t>();
          const int64_t first = s.window > 0 && context > s.window ? context - s.window : 0;
          auto gather = [&](const at::Tensor& cache) {
            return cache.to(at::kFloat).index_select(0, tables[i]).reshape({-1, s.kvHeads, s.dim})
                .narrow(0, first, context - first).transpose(0, 1).unsqueeze(0);  // [1, Hkv, L, D]
          };
          const at::Tensor expected =
              at::scaled_dot_product_attention(q[i].to(at::kFloat).unsqueeze(0).unsqueeze(2), gather(keys),
                                               gather(values), std::nullopt, 0.0, false, scale, s.heads != s.kvHeads)
                  .view({s.heads, s.dim});
          requireClose(out[i], expected, tolerance(dtype, 1.0), what + fmt::format(" sequence {}", i));
        }
      }
    }
  }
}

TEST_CASE("rope_kv_write matches rms_norm, rope and the cache writes of the reference", "[kernels]") {
  struct Shape {
    int64_t tokens, heads, kvHeads, dim;
    bool norms, fused;
  };
  // dim 66: a half of 33, chunks that do not divide it.
  const Shape shapes[] = {{5, 4, 2, 16, false, true}, {3, 8, 2, 64, true, true}, {7, 2, 1, 66, true, false},
                          {1, 1, 1, 2, false, false}};
  for (const PluginSetup& setup : pluginSetups()) {
    configurePlugin(setup);
    for (loom_dtype dtype : kDtypes) {
      for (const Shape& s : shapes) {
        const std::string what = fmt::format("rope_kv_write {} {} [{} tokens, {}/{} heads, dim {}{}{}]", setup.label(),
                                             dtypeName(dtype), s.tokens, s.heads, s.kvHeads, s.dim,
                                             s.norms ? ", norms" : "", s.fused ? ", fused" : "");
        RopeKvWriteCase c = ropeKvWriteCase(s.tokens, s.heads, s.kvHeads, s.dim, s.norms, s.fused, dtype);
        at::Tensor q = at::empty({s.tokens, s.heads, s.dim}, c.q.options());
        REQUIRE(cpuPlugin().rope_kv_write(dtype, c.q.data_ptr(), c.k.data_ptr(), c.v.data_ptr(), c.qStride,
                                          c.kvStride, s.norms ? c.qNorm.data_ptr() : nullptr,
                                          s.norms ? c.kNorm.data_ptr() : nullptr, c.eps, c.cos.data_ptr(),
                                          c.sin.data_ptr(), c.slots.data_ptr<int64_t>(), q.data_ptr(),
                                          c.keyCache.data_ptr(), c.valueCache.data_ptr(), s.tokens, s.heads, s.kvHeads,
                                          s.dim, nullptr) == LOOM_KERNEL_OK);
        // The rotation cancels (error relative to the largest input); a norm's output is within
        // |weight| * sqrt(dim) of the terms.
        const double terms = std::max(s.norms ? maxAbs(c.qNorm.to(at::kFloat)) * std::sqrt(double(s.dim)) : 1.0,
                                      std::max(maxAbs(c.q.to(at::kFloat)), maxAbs(c.k.to(at::kFloat))));
        requireClose(q, c.expectedQ, tolerance(dtype, terms), what + " q");
        requireClose(c.keyCache, c.expectedKeys, tolerance(dtype, terms), what + " key cache");
        CHECK(at::equal(c.valueCache, c.expectedValues));
      }
    }
  }
  // Arguments no implementation could take are errors naming the op and what is wrong.
  float x = 0;
  int64_t slot = 0;
  auto call = [&](int64_t qStride, const void* qNorm, const void* kNorm, int64_t dim) {
    const int rc = cpuPlugin().rope_kv_write(LOOM_DTYPE_F32, &x, &x, &x, qStride, 2 * dim, qNorm, kNorm, 1e-6, &x, &x,
                                             &slot, &x, &x, &x, 1, 2, 2, dim, nullptr);
    return std::make_pair(rc, std::string(cpuPlugin().last_error()));
  };
  auto [odd, oddWhy] = call(6, nullptr, nullptr, 3);
  CHECK(odd == LOOM_KERNEL_INVALID_ARGUMENT);
  CHECK(oddWhy == "rope_kv_write: head_dim must be even, got 3");
  auto [overlap, overlapWhy] = call(4, nullptr, nullptr, 4);
  CHECK(overlap == LOOM_KERNEL_INVALID_ARGUMENT);
  CHECK(overlapWhy.find("rope_kv_write: token rows overlap (q_stride 4 for 2 heads of 4") == 0);
  auto [lone, loneWhy] = call(8, &x, nullptr, 4);
  CHECK(lone == LOOM_KERNEL_INVALID_ARGUMENT);
  CHECK(loneWhy == "rope_kv_write: q_norm and k_norm go together (both or neither)");
}
