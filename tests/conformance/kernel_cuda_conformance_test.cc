// Every layer and vocabulary op of the CUDA plugin against the libtorch reference ops on the same
// CUDA tensors: fresh random inputs of several shapes (odd sizes, rows that start unaligned, a
// 128256-entry vocabulary), fp32 and bf16, on the default stream and on a pool stream. Tolerances
// are the CPU suite's (kernel_compare.h): fp32 1e-6 and bf16 1e-2 relative, plus that bound on
// the size of the terms where a result cancels.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "kernels/reference/reference_ops.h"
#include "tests/catch.h"
#include "tests/conformance/kernel_cuda_conformance.h"

using namespace loom::testing;
namespace ref = loom::kernels::reference;

namespace {

constexpr loom_dtype kDtypes[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16};

double maxAbs(const at::Tensor& t) { return t.numel() ? t.abs().max().item<double>() : 0.0; }

at::Tensor cudaInput(at::IntArrayRef sizes, loom_dtype dtype, double scale = 1.0) {
  return onCuda(randomInput(sizes, dtype, scale));
}

}  // namespace

TEST_CASE("CUDA rms_norm forward and backward match the reference", "[gpu][kernels]") {
  // 12289 and 16384: dweight's shared-memory partial past the default 48 KiB; 2048 rows: blocks
  // that sum several rows each.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},     {3, 7},      {5, 33},    {17, 256},
                                                {64, 4096}, {2048, 1024}, {9, 12289}, {4, 16384}};
  const double eps = 1e-6;
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (auto [rows, dim] : shapes) {
        const std::string what = fmt::format("rms_norm {} {} [{}, {}]", pass.label(), dtypeName(dtype), rows, dim);
        const at::Tensor x = cudaInput({rows, dim}, dtype), w = cudaInput({dim}, dtype),
                         dy = cudaInput({rows, dim}, dtype);
        at::Tensor y = at::empty_like(x), rstd = at::empty({rows}, x.options().dtype(at::kFloat));
        REQUIRE(cudaPlugin().rms_norm_forward(dtype, x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(),
                                              rows, dim, eps, pass.stream()) == LOOM_KERNEL_OK);
        const at::Tensor rstdRef = ref::rmsNormRstd(x, eps);
        const at::Tensor h = x.to(at::kFloat) * rstdRef.unsqueeze(1);
        // bf16: y = w * round(h). rstd's last bit (libtorch's rsqrt and summation order against
        // the plugin's) can move round(h) by one bf16 ulp, at most 2^-7 |h|, which the product
        // carries on top of its own rounding: terms |w h| (times rtol 1e-2 > 2^-7) bound it.
        const at::Tensor yTerms = dtype == LOOM_DTYPE_BF16 ? (w.to(at::kFloat) * h).abs() : at::Tensor();
        requireClose(y, ref::rmsNormForward(x, w, eps), tolerance(dtype, 0.0), what + " y", yTerms);
        requireClose(rstd, rstdRef, tolerance(LOOM_DTYPE_F32, 0.0), what + " rstd");

        auto [dxRef, dwRef] = ref::rmsNormBackward(x, w, dy, eps);
        // dx = r (g - h mean(g h)) and dweight = sum over rows of dy h both cancel: their
        // rounding error is relative to the terms' size, |g| r and the sum of |dy h|.
        const double dxTerms = maxAbs(dy.to(at::kFloat) * w.to(at::kFloat)) * maxAbs(rstdRef);
        const double dwTerms = maxAbs((dy.to(at::kFloat) * h).abs().sum(0));
        for (bool withRstd : {true, false}) {
          at::Tensor dx = at::empty_like(x), dw = at::empty({dim}, x.options().dtype(at::kFloat));
          REQUIRE(cudaPlugin().rms_norm_backward(dtype, x.data_ptr(), w.data_ptr(), dy.data_ptr(),
                                                 withRstd ? rstdRef.data_ptr<float>() : nullptr, dx.data_ptr(),
                                                 dw.data_ptr<float>(), rows, dim, eps,
                                                 pass.stream()) == LOOM_KERNEL_OK);
          requireClose(dx, dxRef, tolerance(dtype, dxTerms), what + (withRstd ? " dx" : " dx (rstd recomputed)"));
          requireClose(dw, dwRef, tolerance(dtype, dwTerms), what + " dweight");
        }
      }
    }
  }
}

TEST_CASE("CUDA add_rms_norm matches a torch add and the reference rms_norm of the sum", "[gpu][kernels]") {
  // 256 x 2048: the 1B Llama's decode step (a chunk a thread); 5 x 33: rows that start unaligned;
  // 3 x 5000 and 2 x 16384: several chunks a thread, up to 8 (bf16) and 16 (fp32), the most one holds.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},      {3, 7},     {5, 33},   {17, 256},
                                                {256, 2048}, {64, 4096}, {3, 5000}, {2, 16384}};
  const double eps = 1e-6;
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (auto [rows, dim] : shapes) {
        const std::string what = fmt::format("add_rms_norm {} {} [{}, {}]", pass.label(), dtypeName(dtype), rows, dim);
        const at::Tensor x = cudaInput({rows, dim}, dtype), residual = cudaInput({rows, dim}, dtype),
                         w = cudaInput({dim}, dtype);
        at::Tensor sum = at::empty_like(x), y = at::empty_like(x);
        REQUIRE(cudaPlugin().add_rms_norm(dtype, x.data_ptr(), residual.data_ptr(), w.data_ptr(), sum.data_ptr(),
                                          y.data_ptr(), rows, dim, eps, pass.stream()) == LOOM_KERNEL_OK);
        const at::Tensor sumRef = x + residual;
        CHECK(at::equal(sum, sumRef));
        // As for rms_norm: rstd's last bit can move round(h) by a bf16 ulp (terms |w h|).
        const at::Tensor h = sumRef.to(at::kFloat) * ref::rmsNormRstd(sumRef, eps).unsqueeze(1);
        const at::Tensor yTerms = dtype == LOOM_DTYPE_BF16 ? (w.to(at::kFloat) * h).abs() : at::Tensor();
        requireClose(y, ref::rmsNormForward(sumRef, w, eps), tolerance(dtype, 0.0), what + " y", yTerms);
      }
    }
  }
  // A row longer than one block holds is refused before anything runs (the model's unfused ops take it).
  const int64_t dim = 256 * 16 * 8 + 8;
  const at::Tensor x = cudaInput({1, dim}, LOOM_DTYPE_BF16);
  at::Tensor out = at::empty_like(x);
  CHECK(cudaPlugin().add_rms_norm(LOOM_DTYPE_BF16, x.data_ptr(), x.data_ptr(), x.data_ptr(), out.data_ptr(),
                                  out.data_ptr(), 1, dim, eps, nullptr) == LOOM_KERNEL_UNSUPPORTED);
}

TEST_CASE("CUDA rms_norm_backward's dweight is the same bits on every run", "[gpu][kernels]") {
  const int64_t rows = 3000, dim = 2048;
  const at::Tensor x = cudaInput({rows, dim}, LOOM_DTYPE_BF16), w = cudaInput({dim}, LOOM_DTYPE_BF16),
                   dy = cudaInput({rows, dim}, LOOM_DTYPE_BF16);
  auto run = [&] {
    at::Tensor dx = at::empty_like(x), dw = at::empty({dim}, x.options().dtype(at::kFloat));
    REQUIRE(cudaPlugin().rms_norm_backward(LOOM_DTYPE_BF16, x.data_ptr(), w.data_ptr(), dy.data_ptr(), nullptr,
                                           dx.data_ptr(), dw.data_ptr<float>(), rows, dim, 1e-6,
                                           nullptr) == LOOM_KERNEL_OK);
    return std::make_pair(dx, dw);
  };
  auto [dx1, dw1] = run();
  auto [dx2, dw2] = run();
  CHECK(at::equal(dx1, dx2));
  CHECK(at::equal(dw1, dw2));
}

TEST_CASE("CUDA rope forward and backward match the reference", "[gpu][kernels]") {
  struct Shape {
    int64_t batch, qHeads, kHeads, seq, headDim;
    bool perBatchCos;
  };
  const Shape shapes[] = {{1, 1, 1, 1, 2, false},  {2, 4, 2, 5, 8, false},     {1, 3, 1, 17, 66, true},
                          {2, 8, 8, 33, 128, true}, {4, 32, 8, 128, 128, false}, {1, 2, 0, 9, 64, false}};
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (const Shape& s : shapes) {
        const std::string what =
            fmt::format("rope {} {} q [{}, {}, {}, {}] k heads {}{}", pass.label(), dtypeName(dtype), s.batch,
                        s.qHeads, s.seq, s.headDim, s.kHeads, s.perBatchCos ? ", cos per batch" : "");
        const at::Tensor q = cudaInput({s.batch, s.qHeads, s.seq, s.headDim}, dtype);
        const at::Tensor k = cudaInput({s.batch, s.kHeads, s.seq, s.headDim}, dtype);
        // Real tables: angles per position and frequency, the two halves equal (as HF builds
        // them); the per-batch variant shifts positions per sequence.
        const int64_t tableBatch = s.perBatchCos ? s.batch : 1;
        const at::Tensor angles = onCuda(at::rand({tableBatch, s.seq, s.headDim / 2}) * 10.0);
        const at::Tensor full = at::cat({angles, angles}, -1);
        const at::Tensor cos = (s.perBatchCos ? full.cos() : full.cos()[0]).contiguous().to(q.scalar_type());
        const at::Tensor sin = (s.perBatchCos ? full.sin() : full.sin()[0]).contiguous().to(q.scalar_type());
        const int64_t stride = s.perBatchCos ? s.seq * s.headDim : 0;
        for (bool backward : {false, true}) {
          at::Tensor qo = q.clone(), ko = k.clone();
          auto fn = backward ? cudaPlugin().rope_backward : cudaPlugin().rope_forward;
          REQUIRE(fn(dtype, qo.data_ptr(), s.kHeads ? ko.data_ptr() : nullptr, cos.data_ptr(), sin.data_ptr(),
                     s.batch, s.qHeads, s.kHeads, s.seq, s.headDim, stride, pass.stream()) == LOOM_KERNEL_OK);
          auto [qRef, kRef] = backward ? ref::ropeBackward(q, k, cos, sin) : ref::ropeForward(q, k, cos, sin);
          // x1 cos - x2 sin cancels: error relative to the largest |x|.
          const std::string dir = backward ? " backward" : " forward";
          requireClose(qo, qRef, tolerance(dtype, std::max(maxAbs(q.to(at::kFloat)), 1.0)), what + dir + " q");
          requireClose(ko, kRef, tolerance(dtype, std::max(maxAbs(k.to(at::kFloat)), 1.0)), what + dir + " k");
        }
      }
    }
  }
}

TEST_CASE("CUDA swiglu forward and backward match the reference", "[gpu][kernels]") {
  const int64_t sizes[] = {1, 15, 17, 1000, 100003, (1 << 22) + 3};
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (int64_t n : sizes) {
        // offset 1: tensors that start one element past an allocation, so no 16-byte loads.
        for (int64_t offset : {0, 1}) {
          const std::string what =
              fmt::format("swiglu {} {} [{}]{}", pass.label(), dtypeName(dtype), n, offset ? " unaligned" : "");
          auto input = [&](double scale) { return cudaInput({n + offset}, dtype, scale).slice(0, offset); };
          const at::Tensor gate = input(3.0), up = input(1.0), dout = input(1.0);
          at::Tensor out = at::empty({n + offset}, gate.options()).slice(0, offset);
          REQUIRE(cudaPlugin().swiglu_forward(dtype, gate.data_ptr(), up.data_ptr(), out.data_ptr(), n,
                                              pass.stream()) == LOOM_KERNEL_OK);
          requireClose(out, ref::swigluForward(gate, up), tolerance(dtype, 0.0), what + " out");
          at::Tensor dg = at::empty({n + offset}, gate.options()).slice(0, offset), du = at::empty_like(dg);
          REQUIRE(cudaPlugin().swiglu_backward(dtype, gate.data_ptr(), up.data_ptr(), dout.data_ptr(), dg.data_ptr(),
                                               du.data_ptr(), n, pass.stream()) == LOOM_KERNEL_OK);
          auto [dgRef, duRef] = ref::swigluBackward(gate, up, dout);
          // silu' = sig (1 + g (1 - sig)) passes through 0 near g = -1.28: error relative to the
          // size of its terms, |dout up| (1 + |g|).
          const double dgTerms =
              maxAbs(dout.to(at::kFloat) * up.to(at::kFloat)) * (1.0 + maxAbs(gate.to(at::kFloat)));
          requireClose(dg, dgRef, tolerance(dtype, dgTerms), what + " dgate");
          requireClose(du, duRef, tolerance(dtype, 0.0), what + " dup");
        }
      }
    }
  }
}

TEST_CASE("CUDA clamped swiglu forward and backward match the reference", "[gpu][kernels]") {
  const int64_t sizes[] = {1, 17, 1000, 100003, (1 << 22) + 3};
  const double alpha = 1.702, limit = 7.0;  // GPT-OSS's
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (int64_t n : sizes) {
        const std::string what = fmt::format("clamped swiglu {} {} [{}]", pass.label(), dtypeName(dtype), n);
        // Wide enough that both clamps bite: |x| > 7 for about 1 element in 4.
        const at::Tensor gate = cudaInput({n}, dtype, 6.0), up = cudaInput({n}, dtype, 6.0),
                         dout = cudaInput({n}, dtype, 1.0);
        at::Tensor out = at::empty_like(gate);
        REQUIRE(cudaPlugin().clamped_swiglu_forward(dtype, gate.data_ptr(), up.data_ptr(), out.data_ptr(), n, alpha,
                                                    limit, pass.stream()) == LOOM_KERNEL_OK);
        requireClose(out, ref::clampedSwigluForward(gate, up, alpha, limit), tolerance(dtype, 0.0), what + " out");
        at::Tensor dg = at::empty_like(gate), du = at::empty_like(up);
        REQUIRE(cudaPlugin().clamped_swiglu_backward(dtype, gate.data_ptr(), up.data_ptr(), dout.data_ptr(),
                                                     dg.data_ptr(), du.data_ptr(), n, alpha, limit,
                                                     pass.stream()) == LOOM_KERNEL_OK);
        auto [dgRef, duRef] = ref::clampedSwigluBackward(gate, up, dout, alpha, limit);
        // As on the CPU: d(g sigmoid(a g)) passes through 0, so the error is relative to its
        // terms, at most |dout| (limit + 1) (1 + a limit).
        const double dgTerms = maxAbs(dout.to(at::kFloat)) * (limit + 1.0) * (1.0 + alpha * limit);
        requireClose(dg, dgRef, tolerance(dtype, dgTerms), what + " dgate");
        requireClose(du, duRef, tolerance(dtype, maxAbs(dout.to(at::kFloat)) * limit), what + " dup");
      }
    }
  }
}

TEST_CASE("CUDA masked softmax forward and backward match the reference - a fully masked row is 0",
          "[gpu][kernels]") {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 17}, {8, 129}, {4, 1000}, {2048, 2048}};
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (auto [rows, cols] : shapes) {
        for (bool masked : {false, true}) {
          const std::string what = fmt::format("masked softmax {} {} [{}, {}]{}", pass.label(), dtypeName(dtype), rows,
                                               cols, masked ? " with a mask" : "");
          const double scale = 0.125;
          const at::Tensor x = cudaInput({rows, cols}, dtype, 20.0), dy = cudaInput({rows, cols}, dtype, 1.0);
          at::Tensor mask = onCuda((at::rand({rows, cols}) > 0.3).to(at::kByte));
          if (rows > 1) mask[1].zero_();  // nothing left in row 1
          at::Tensor y = at::empty_like(x);
          REQUIRE(cudaPlugin().masked_softmax_forward(dtype, x.data_ptr(), masked ? mask.data_ptr<uint8_t>() : nullptr,
                                                      y.data_ptr(), rows, cols, scale,
                                                      pass.stream()) == LOOM_KERNEL_OK);
          const at::Tensor yRef = ref::maskedSoftmaxForward(x, masked ? mask.to(at::kBool) : at::Tensor(), scale);
          // exp's argument rounding and the normalizer's sum, as in the CPU suite.
          const at::Tensor z = x.to(at::kFloat) * scale - (x.to(at::kFloat) * scale).amax(-1, true);
          const at::Tensor expTerms = yRef.to(at::kFloat).abs() * (z.abs() + std::log2(double(cols)) + 1) *
                                      (std::ldexp(1.0, -24) / 1e-6);
          requireClose(y, yRef, tolerance(dtype, 0.0), what + " y", expTerms);
          if (masked && rows > 1) CHECK(y[1].to(at::kFloat).abs().sum().item<double>() == 0.0);
          at::Tensor dx = at::empty_like(x);
          REQUIRE(cudaPlugin().masked_softmax_backward(dtype, yRef.data_ptr(), dy.data_ptr(), dx.data_ptr(), rows, cols,
                                                       scale, pass.stream()) == LOOM_KERNEL_OK);
          requireClose(dx, ref::maskedSoftmaxBackward(yRef, dy, scale),
                       tolerance(dtype, scale * maxAbs(dy.to(at::kFloat)) * 2.0), what + " dx");
        }
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
  return onCuda(labels);
}

void checkVocabOps(const StreamPass& pass, loom_dtype dtype, int64_t rows, int64_t vocab) {
  const std::string what = fmt::format("{} {} [{}, {}]", pass.label(), dtypeName(dtype), rows, vocab);
  const loom_kernel_table& t = cudaPlugin();
  const at::Tensor logits = cudaInput({rows, vocab}, dtype, 3.0);
  const at::Tensor other = (logits.to(at::kFloat) + onCuda(at::randn({rows, vocab}))).to(logits.scalar_type());
  const at::Tensor labels = randomLabels(rows, vocab, true), inRange = randomLabels(rows, vocab, false);
  const at::Tensor dloss = onCuda(at::randn({rows}));
  const auto f32 = logits.options().dtype(at::kFloat);
  // Results are differences of log-sum-exps: their error is relative to lse's size. Over 128256
  // entries that bound (about 3e-5 absolute here) also covers the fp32 sums' reordering: each
  // thread sums a few hundred exponentials, then a tree joins the threads, against libtorch's
  // own reduction order.
  const double lseScale = std::log(static_cast<double>(vocab)) + maxAbs(logits.to(at::kFloat)) + 1.0;
  const Tolerance tol = tolerance(dtype, lseScale);

  at::Tensor loss = at::empty({rows}, f32), lse = at::empty({rows}, f32);
  REQUIRE(t.cross_entropy_forward(dtype, logits.data_ptr(), labels.data_ptr<int64_t>(), rows, vocab, -100,
                                  loss.data_ptr<float>(), lse.data_ptr<float>(), pass.stream()) == LOOM_KERNEL_OK);
  const ref::CrossEntropyRows expected = ref::crossEntropyForward(logits, labels, -100);
  requireClose(loss, expected.loss, tol, "cross_entropy_forward loss " + what);
  const at::Tensor kept = labels != -100;
  requireClose(lse.masked_select(kept), expected.lse.masked_select(kept), tol, "cross_entropy_forward lse " + what);

  // p = exp(x - lse) carries the rounding of x - lse, relative to |x| + |lse| (1 ulp of lse ~ 10
  // is 1e-6 of p already), and p - 1 at the label cancels when p ~ 1: terms |p| lseScale + |dloss|.
  const at::Tensor dRef = ref::crossEntropyBackward(logits, labels, dloss, -100);
  const at::Tensor terms = dRef.to(at::kFloat).abs() * lseScale + dloss.abs().unsqueeze(1);
  for (bool withLse : {true, false}) {
    at::Tensor d = at::empty_like(logits);
    REQUIRE(t.cross_entropy_backward(dtype, logits.data_ptr(), labels.data_ptr<int64_t>(),
                                     withLse ? expected.lse.data_ptr<float>() : nullptr, dloss.data_ptr<float>(),
                                     d.data_ptr(), rows, vocab, -100, pass.stream()) == LOOM_KERNEL_OK);
    requireClose(d, dRef, tolerance(dtype, 0.0),
                 "cross_entropy_backward " + what + (withLse ? "" : " (lse recomputed)"), terms);
  }

  at::Tensor out = at::empty({rows}, f32);
  REQUIRE(t.logprobs(dtype, logits.data_ptr(), inRange.data_ptr<int64_t>(), rows, vocab, out.data_ptr<float>(),
                     pass.stream()) == LOOM_KERNEL_OK);
  requireClose(out, ref::logprobs(logits, inRange), tol, "logprobs " + what);
  REQUIRE(t.entropy(dtype, logits.data_ptr(), rows, vocab, out.data_ptr<float>(), pass.stream()) == LOOM_KERNEL_OK);
  requireClose(out, ref::entropy(logits), tol, "entropy " + what);
  REQUIRE(t.kl_divergence(dtype, logits.data_ptr(), other.data_ptr(), rows, vocab, out.data_ptr<float>(),
                          pass.stream()) == LOOM_KERNEL_OK);
  requireClose(out, ref::klDivergence(logits, other), tol, "kl_divergence " + what);
}

}  // namespace

TEST_CASE("CUDA cross_entropy, logprobs, entropy and KL over the vocabulary match the reference", "[gpu][kernels]") {
  // 32003: rows that start unaligned; 128256: Llama 3's vocabulary.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 7}, {17, 1000}, {6, 32003}, {40, 128256}};
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes)
      for (auto [rows, vocab] : shapes) checkVocabOps(pass, dtype, rows, vocab);
  }
}

TEST_CASE("CUDA greedy_logprobs picks as torch.argmax does, with log_softmax at the pick", "[gpu][kernels]") {
  // 256 x 128256: the 1B Llama's decode step; 5 x 33: rows that start unaligned.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 8}, {5, 33}, {17, 1000}, {256, 128256}};
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (auto [rows, vocab] : shapes) {
        const GreedyCase c = greedyCase(rows, vocab, dtype);
        const at::Tensor logits = onCuda(c.logits);
        at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
        at::Tensor logprobs = at::empty({rows}, logits.options().dtype(at::kFloat));
        REQUIRE(cudaPlugin().greedy_logprobs(dtype, logits.data_ptr(), rows, vocab, tokens.data_ptr<int64_t>(),
                                             logprobs.data_ptr<float>(), pass.stream()) == LOOM_KERNEL_OK);
        checkGreedy(c, tokens, logprobs,
                    fmt::format("greedy_logprobs {} {} [{}, {}]", pass.label(), dtypeName(dtype), rows, vocab));
      }
    }
  }
}

TEST_CASE("CUDA: a label outside the vocabulary makes its row NaN and the next labelled call an error",
          "[gpu][kernels]") {
  const loom_kernel_table& t = cudaPlugin();
  const at::Tensor logits = onCuda(at::randn({3, 10}));
  const at::Tensor labels = onCuda(at::tensor({3, 10, -100}, at::kLong));
  const auto f32 = logits.options().dtype(at::kFloat);
  // Nothing pending from earlier tests: a call with no rows only looks at the record.
  REQUIRE(t.cross_entropy_forward(LOOM_DTYPE_F32, nullptr, nullptr, 0, 10, -100, nullptr, nullptr, nullptr) ==
          LOOM_KERNEL_OK);

  at::Tensor loss = at::full({3}, 7.0f, f32);
  REQUIRE(t.cross_entropy_forward(LOOM_DTYPE_F32, logits.data_ptr(), labels.data_ptr<int64_t>(), 3, 10, -100,
                                  loss.data_ptr<float>(), nullptr, nullptr) == LOOM_KERNEL_OK);
  const at::Tensor host = loss.cpu();  // synchronizes: the kernel has run
  CHECK(std::isfinite(host[0].item<float>()));
  CHECK(std::isnan(host[1].item<float>()));
  CHECK(host[2].item<float>() == 0.0f);

  REQUIRE(t.cross_entropy_forward(LOOM_DTYPE_F32, nullptr, nullptr, 0, 10, -100, nullptr, nullptr, nullptr) ==
          LOOM_KERNEL_INVALID_ARGUMENT);
  const std::string message = t.last_error();
  INFO(message);
  CHECK(message.find("label 10 in row 1") != std::string::npos);
  CHECK(message.find("cross_entropy_forward") != std::string::npos);
  // Reported once.
  CHECK(t.cross_entropy_forward(LOOM_DTYPE_F32, nullptr, nullptr, 0, 10, -100, nullptr, nullptr, nullptr) ==
        LOOM_KERNEL_OK);

  // logprobs ignores nothing: -100 is a bad label there; the backward fills the bad row with NaN.
  at::Tensor out = at::empty({3}, f32), d = at::zeros_like(logits);
  const at::Tensor dloss = onCuda(at::ones({3}));
  REQUIRE(t.cross_entropy_backward(LOOM_DTYPE_F32, logits.data_ptr(), labels.data_ptr<int64_t>(), nullptr,
                                   dloss.data_ptr<float>(), d.data_ptr(), 3, 10, -100, nullptr) == LOOM_KERNEL_OK);
  const at::Tensor dHost = d.cpu();
  CHECK(dHost[1].isnan().all().item<bool>());
  CHECK(dHost[2].eq(0).all().item<bool>());
  CHECK(t.logprobs(LOOM_DTYPE_F32, logits.data_ptr(), labels.data_ptr<int64_t>(), 3, 10, out.data_ptr<float>(),
                   nullptr) == LOOM_KERNEL_INVALID_ARGUMENT);  // the backward's record
  REQUIRE(t.logprobs(LOOM_DTYPE_F32, logits.data_ptr(), labels.data_ptr<int64_t>(), 3, 10, out.data_ptr<float>(),
                     nullptr) == LOOM_KERNEL_OK);
  const at::Tensor outHost = out.cpu();
  CHECK(std::isnan(outHost[1].item<float>()));
  CHECK(std::isnan(outHost[2].item<float>()));
  // Rows 1 and 2 both had bad labels: the record holds one of them, whole.
  REQUIRE(t.logprobs(LOOM_DTYPE_F32, nullptr, nullptr, 0, 10, nullptr, nullptr) == LOOM_KERNEL_INVALID_ARGUMENT);
  const std::string second = t.last_error();
  INFO(second);
  CHECK((second.find("label 10 in row 1") != std::string::npos ||
         second.find("label -100 in row 2") != std::string::npos));
}

TEST_CASE("CUDA: dtypes other than fp32 and bf16 are refused before anything runs", "[gpu][kernels]") {
  const loom_kernel_table& t = cudaPlugin();
  const at::Tensor x = onCuda(at::ones({4}));
  at::Tensor out = at::full({4}, 7.0f, x.options());
  CHECK(t.swiglu_forward(static_cast<loom_dtype>(7), x.data_ptr(), x.data_ptr(), out.data_ptr(), 4, nullptr) ==
        LOOM_KERNEL_UNSUPPORTED);
  CHECK(std::string(t.last_error()).find("neither fp32 nor bf16") != std::string::npos);
  CHECK(out.eq(7.0f).all().item<bool>());
  CHECK(std::string(t.device) == "cuda");
}

TEST_CASE("CUDA paged decode attention matches attention over the gathered keys and values", "[gpu][kernels]") {
  struct Shape {
    int64_t seqs, heads, kvHeads, dim, blockSize, maxContext, window;
  };
  const Shape shapes[] = {{3, 8, 2, 64, 16, 300, 0},   {64, 32, 8, 64, 16, 1000, 0}, {5, 4, 4, 128, 16, 70, 0},
                          {7, 16, 2, 32, 8, 90, 0},     {6, 8, 2, 64, 16, 200, 8}};
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (const Shape& s : shapes) {
        const std::string what = fmt::format("paged decode {} {} [{} seqs, {}/{} heads, dim {}, window {}]",
                                             pass.label(), dtypeName(dtype), s.seqs, s.heads, s.kvHeads, s.dim,
                                             s.window);
        const at::Tensor lengths = at::randint(1, s.maxContext + 1, {s.seqs}, at::kLong);
        lengths[0] = 1;  // a sequence of one position
        const int64_t maxBlocks = (s.maxContext + s.blockSize - 1) / s.blockSize;
        const int64_t numBlocks = s.seqs * maxBlocks + 3;
        // Each sequence's blocks scattered over the cache, the padding pointing at block 0.
        const at::Tensor tables = at::randperm(numBlocks, at::kLong).narrow(0, 0, s.seqs * maxBlocks)
                                      .view({s.seqs, maxBlocks});
        const at::Tensor keys = cudaInput({numBlocks, s.blockSize, s.kvHeads, s.dim}, dtype);
        const at::Tensor values = cudaInput({numBlocks, s.blockSize, s.kvHeads, s.dim}, dtype);
        const at::Tensor q = cudaInput({s.seqs, s.heads, s.dim}, dtype);
        const at::Tensor tablesCuda = onCuda(tables), lengthsCuda = onCuda(lengths);
        at::Tensor out = at::empty_like(q);
        const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
        REQUIRE(cudaPlugin().paged_attention_decode(dtype, q.data_ptr(), keys.data_ptr(), values.data_ptr(),
                                                    tablesCuda.data_ptr<int64_t>(), lengthsCuda.data_ptr<int64_t>(),
                                                    out.data_ptr(), s.seqs, s.heads, s.kvHeads, s.dim, s.blockSize,
                                                    maxBlocks, scale, s.window, pass.stream()) == LOOM_KERNEL_OK);
        for (int64_t i = 0; i < s.seqs; ++i) {
          const int64_t context = lengths[i].item<int64_t>();
          const int64_t first = s.window > 0 && context > s.window ? context - s.window : 0;
          const at::Tensor blocks = onCuda(tables[i]);
          auto gather = [&](const at::Tensor& cache) {
            return cache.to(at::kFloat).index_select(0, blocks).reshape({-1, s.kvHeads, s.dim})
                .narrow(0, first, context - first).transpose(0, 1).unsqueeze(0);  // [1, Hkv, L, D]
          };
          const at::Tensor expected =
              at::scaled_dot_product_attention(q[i].to(at::kFloat).unsqueeze(0).unsqueeze(2), gather(keys),
                                               gather(values), std::nullopt, 0.0, false, scale, s.heads != s.kvHeads)
                  .view({s.heads, s.dim});
          requireClose(out[i], expected, tolerance(dtype, 1.0), what + fmt::format(" sequence {} ({} positions)", i, context));
        }
      }
    }
  }
  // Head layouts it is not built for are refused, so that the reference runs instead.
  CHECK(cudaPlugin().paged_attention_decode(LOOM_DTYPE_F32, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 12,
                                            4, 64, 16, 1, 0.125, 0, nullptr) == LOOM_KERNEL_UNSUPPORTED);
}

TEST_CASE("CUDA rope_kv_write matches rms_norm, rope and the cache writes of the reference", "[gpu][kernels]") {
  struct Shape {
    int64_t tokens, heads, kvHeads, dim;
    bool norms, fused;
  };
  // The 1B Llama's decode step (256 tokens, 32/8 heads of 64), Qwen3's norms at head_dim 128, a
  // head_dim of 66 (a half of 33: chunks that do not divide it) and one of 512 (rows of 32 lanes
  // that loop).
  const Shape shapes[] = {{256, 32, 8, 64, false, true},  {9, 16, 8, 128, true, true}, {7, 2, 1, 66, true, false},
                          {3, 4, 2, 512, true, true},     {1, 1, 1, 2, false, false}};
  for (bool pooled : kPooledStream) {
    const StreamPass pass(pooled);
    for (loom_dtype dtype : kDtypes) {
      for (const Shape& s : shapes) {
        const std::string what = fmt::format("rope_kv_write {} {} [{} tokens, {}/{} heads, dim {}{}{}]", pass.label(),
                                             dtypeName(dtype), s.tokens, s.heads, s.kvHeads, s.dim,
                                             s.norms ? ", norms" : "", s.fused ? ", fused" : "");
        const RopeKvWriteCase c = ropeKvWriteCase(s.tokens, s.heads, s.kvHeads, s.dim, s.norms, s.fused, dtype);
        // The same layout on the device: views of one projection, or tensors of their own.
        at::Tensor q, k, v;
        if (s.fused) {
          const at::Tensor projection = onCuda(c.projection);
          q = projection.narrow(1, 0, s.heads);
          k = projection.narrow(1, s.heads, s.kvHeads);
          v = projection.narrow(1, s.heads + s.kvHeads, s.kvHeads);
        } else {
          q = onCuda(c.q), k = onCuda(c.k), v = onCuda(c.v);
        }
        const at::Tensor qNorm = s.norms ? onCuda(c.qNorm) : at::Tensor(), kNorm = s.norms ? onCuda(c.kNorm) : at::Tensor();
        const at::Tensor cos = onCuda(c.cos), sin = onCuda(c.sin), slots = onCuda(c.slots);
        at::Tensor keys = onCuda(c.keyCache), values = onCuda(c.valueCache);
        at::Tensor out = at::empty({s.tokens, s.heads, s.dim}, q.options());
        REQUIRE(cudaPlugin().rope_kv_write(dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), k.stride(0),
                                           s.norms ? qNorm.data_ptr() : nullptr, s.norms ? kNorm.data_ptr() : nullptr,
                                           c.eps, cos.data_ptr(), sin.data_ptr(), slots.data_ptr<int64_t>(),
                                           out.data_ptr(), keys.data_ptr(), values.data_ptr(), s.tokens, s.heads,
                                           s.kvHeads, s.dim, pass.stream()) == LOOM_KERNEL_OK);
        const double terms = std::max(s.norms ? maxAbs(c.qNorm.to(at::kFloat)) * std::sqrt(double(s.dim)) : 1.0,
                                      std::max(maxAbs(c.q.to(at::kFloat)), maxAbs(c.k.to(at::kFloat))));
        requireClose(out, c.expectedQ, tolerance(dtype, terms), what + " q");
        requireClose(keys, c.expectedKeys, tolerance(dtype, terms), what + " key cache");
        CHECK(at::equal(values.cpu(), c.expectedValues));
      }
    }
  }
}
