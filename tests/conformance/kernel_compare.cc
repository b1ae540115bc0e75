#include "tests/conformance/kernel_compare.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "kernels/reference/reference_ops.h"
#include "tests/catch.h"

namespace loom::testing {

uint64_t testSeed() {
  static const uint64_t seed = [] {
    const char* fixed = std::getenv("LOOM_TEST_SEED");
    const uint64_t s = fixed ? std::strtoull(fixed, nullptr, 10) : std::random_device{}();
    std::printf("kernel conformance: random inputs from seed %llu (LOOM_TEST_SEED=%llu repeats them)\n",
                static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    at::manual_seed(s);
    return s;
  }();
  return seed;
}

at::Tensor randomInput(at::IntArrayRef sizes, loom_dtype dtype, double scale) {
  testSeed();
  at::Tensor t = at::randn(sizes) * scale;
  return dtype == LOOM_DTYPE_BF16 ? t.to(at::kBFloat16) : t;
}

RopeKvWriteCase ropeKvWriteCase(int64_t tokens, int64_t heads, int64_t kvHeads, int64_t dim, bool norms, bool fused,
                                loom_dtype dtype) {
  namespace ref = kernels::reference;
  RopeKvWriteCase c{.tokens = tokens, .heads = heads, .kvHeads = kvHeads, .dim = dim, .eps = 1e-6};
  if (fused) {
    c.projection = randomInput({tokens, heads + 2 * kvHeads, dim}, dtype);
    c.q = c.projection.narrow(1, 0, heads);
    c.k = c.projection.narrow(1, heads, kvHeads);
    c.v = c.projection.narrow(1, heads + kvHeads, kvHeads);
  } else {
    c.q = randomInput({tokens, heads, dim}, dtype);
    c.k = randomInput({tokens, kvHeads, dim}, dtype);
    c.v = randomInput({tokens, kvHeads, dim}, dtype);
  }
  c.qStride = c.q.stride(0), c.kvStride = c.k.stride(0);
  if (norms) c.qNorm = randomInput({dim}, dtype), c.kNorm = randomInput({dim}, dtype);
  // Real tables, as HF builds them: an angle per position and frequency, the two halves equal.
  const at::Tensor angles = at::rand({tokens, dim / 2}) * 100.0;
  const at::Tensor full = at::cat({angles, angles}, -1);
  const at::ScalarType type = c.q.scalar_type();
  c.cos = full.cos().to(type), c.sin = full.sin().to(type);
  const int64_t rows = 2 * tokens + 3;
  c.slots = at::randperm(rows, at::kLong).narrow(0, 0, tokens).contiguous();
  c.keyCache = randomInput({rows, kvHeads, dim}, dtype);
  c.valueCache = randomInput({rows, kvHeads, dim}, dtype);

  auto normed = [&](const at::Tensor& x, const at::Tensor& weight) {
    if (!weight.defined()) return x.contiguous();
    return ref::rmsNormForward(x.reshape({-1, dim}), weight, c.eps).view(x.sizes());
  };
  // Each token a batch row of one position: x [tokens, heads, 1, dim], its angles [tokens, 1, dim].
  auto [q, k] = ref::ropeForward(normed(c.q, c.qNorm).unsqueeze(2), normed(c.k, c.kNorm).unsqueeze(2),
                                 c.cos.unsqueeze(1), c.sin.unsqueeze(1));
  c.expectedQ = q.squeeze(2);
  c.expectedKeys = c.keyCache.clone().index_copy_(0, c.slots, k.squeeze(2));
  c.expectedValues = c.valueCache.clone().index_copy_(0, c.slots, c.v);
  return c;
}

GreedyCase greedyCase(int64_t rows, int64_t vocab, loom_dtype dtype) {
  at::Tensor logits = randomInput({rows, vocab}, dtype, 3.0);
  if (rows >= 3 && vocab >= 8) {
    const double top = logits.to(at::kFloat).max().item<double>() + 1.0;
    logits[0][2] = top, logits[0][6] = top;
    logits[1][3] = NAN, logits[1][7] = NAN;
  }
  const at::Tensor tokens = logits.argmax(-1);
  // In fp64: libtorch's fp32 log_softmax sums a 128256-entry row in a few long runs, and its own
  // rounding (a few 1e-5 there) would take most of the bound the plugins are held to.
  const at::Tensor logprobs = at::log_softmax(logits.to(at::kDouble), -1).gather(1, tokens.unsqueeze(1)).squeeze(1);
  return {logits, tokens, logprobs};
}

void checkGreedy(const GreedyCase& c, const at::Tensor& tokens, const at::Tensor& logprobs, const std::string& what) {
  INFO(what << " (seed " << testSeed() << ")");
  CHECK(at::equal(tokens.cpu(), c.tokens));
  const at::Tensor got = logprobs.cpu(), nan = c.logprobs.isnan();
  CHECK(at::equal(got.isnan(), nan));
  const at::Tensor logits = c.logits.to(at::kFloat);
  const double largest = logits.nan_to_num(0).abs().max().item<double>();
  const double lseScale = std::log(static_cast<double>(logits.size(1))) + largest;
  const Tolerance tol = tolerance(LOOM_DTYPE_F32, lseScale + 1.0);
  requireClose(got.masked_select(~nan), c.logprobs.masked_select(~nan), tol, what + " logprobs");
}

Tolerance tolerance(loom_dtype dtype, double termScale) {
  const double rtol = dtype == LOOM_DTYPE_BF16 ? 0x1p-6 : 1e-6;
  return {rtol, rtol * termScale};
}

void requireClose(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol, const std::string& what,
                  const at::Tensor& terms) {
  INFO(what << " (seed " << testSeed() << ")");
  REQUIRE(actual.sizes() == expected.sizes());
  auto host = [](const at::Tensor& t) { return t.to(at::kCPU).to(at::kDouble).flatten(); };
  const at::Tensor a = host(actual), e = host(expected);
  if (a.numel() == 0) return;
  at::Tensor bound = tol.rtol * e.abs() + tol.atol;
  if (terms.defined()) bound = bound + tol.rtol * host(terms);
  const at::Tensor excess = (a - e).abs() - bound;
  const int64_t worst = excess.argmax().item<int64_t>();
  const double over = excess[worst].item<double>();
  // NaN anywhere fails, as does any element past its bound.
  const bool nan = a.isnan().any().item<bool>() != e.isnan().any().item<bool>();
  std::ostringstream msg;
  msg << "worst element " << worst << " of " << a.numel() << ": " << a[worst].item<double>() << " vs reference "
      << e[worst].item<double>() << " (|diff| " << std::abs(a[worst].item<double>() - e[worst].item<double>())
      << ", rtol " << tol.rtol << ", atol " << tol.atol << (terms.defined() ? " + rtol * terms" : "") << ")";
  INFO(msg.str());
  CHECK_FALSE(nan);
  CHECK(over <= 0.0);
}

OptimizerState OptimizerState::copy() const {
  return {param.clone(), first.clone(), second.defined() ? second.clone() : at::Tensor()};
}

OptimizerTerms OptimizerTerms::of(const OptimizerState& s) {
  auto z = [](const at::Tensor& t) {
    return t.defined() ? at::zeros(t.sizes(), t.options().dtype(at::kDouble)) : at::Tensor();
  };
  return {z(s.param), z(s.first), z(s.second)};
}

void OptimizerTerms::add(const OptimizerState& before, const OptimizerState& after) {
  auto acc = [](at::Tensor& terms, const at::Tensor& b, const at::Tensor& a) {
    if (!terms.defined()) return;
    const at::Tensor bd = b.to(at::kDouble), ad = a.to(at::kDouble);
    terms += bd.abs() + (ad - bd).abs();
  };
  acc(param, before.param, after.param);
  acc(first, before.first, after.first);
  acc(second, before.second, after.second);
}

void compareOptimizerStates(const OptimizerState& mine, const OptimizerState& ref, const OptimizerTerms& terms,
                            loom_dtype paramDtype, const std::string& what) {
  requireClose(mine.param, ref.param, tolerance(paramDtype, 0.0), what + " param", terms.param);
  requireClose(mine.first, ref.first, tolerance(paramDtype, 0.0), what + " state 1", terms.first);
  if (mine.second.defined())
    requireClose(mine.second, ref.second, tolerance(paramDtype, 0.0), what + " state 2", terms.second);
}

}  // namespace loom::testing
