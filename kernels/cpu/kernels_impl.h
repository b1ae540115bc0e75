// The CPU kernels, written once over `Vec` (vec_scalar.h, vec_avx2.h, vec_avx512.h) and compiled
// once per instruction set: isa_*.cc include this file inside their own namespace, after their
// Vec and inside their target region, so every function here gets that ISA's target attribute
// and internal copies never mix across instruction sets. It includes nothing itself (the
// including file brings <cmath>, <limits>, <type_traits> and cpu_kernels.h first).
//
// Rounding follows the libtorch reference where it is cheap to: the same operation order as
// torch.optim's tensor ops (lerp as an FMA, addcmul / addcdiv as (value * t1) op t2, add with
// alpha as an FMA), bf16 intermediates rounded where HF's modules round them; everything else is
// fp32 math with one rounding to the output dtype.

using Reg = Vec::Reg;
constexpr int64_t kW = Vec::kWidth;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Whole vectors, and the tail through a small buffer (the same arithmetic on both).
struct Full {
  template <typename T>
  Reg ld(const T* p, float = 0.0f) const {
    return Vec::load(p);
  }
  template <typename T>
  void st(T* p, Reg v) const {
    Vec::store(p, v);
  }
};
struct Part {
  int64_t n;
  template <typename T>
  Reg ld(const T* p, float fill = 0.0f) const {
    T buf[kW];
    for (int64_t i = 0; i < kW; ++i) buf[i] = i < n ? p[i] : fromFloat<T>(fill);
    return Vec::load(buf);
  }
  template <typename T>
  void st(T* p, Reg v) const {
    T buf[kW];
    Vec::store(buf, v);
    for (int64_t i = 0; i < n; ++i) p[i] = buf[i];
  }
};

// body(i, io) for i = begin, begin + kW, ...: io is Full, or Part for the last partial vector.
template <typename Body>
inline void elementwise(int64_t begin, int64_t end, Body&& body) {
  int64_t i = begin;
  for (; i + kW <= end; i += kW) body(i, Full{});
  if (i < end) body(i, Part{end - i});
}

template <typename T>
inline Reg roundTo(Reg v) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return Vec::roundBf16(v);
  } else {
    return v;
  }
}

template <typename F>
inline void byDtype(loom_dtype dtype, F&& f) {
  if (dtype == LOOM_DTYPE_BF16) {
    f(Bf16{});
  } else {
    f(float{});
  }
}

// ---- RMSNorm ----

// Long sums go in blocks: each block's partial joins a running total, so rounding grows with the
// block length plus the number of blocks, not with the row length (the scalar path has one lane).
constexpr int64_t kSumBlock = 256 * kW;
inline int64_t blockEnd(int64_t begin, int64_t n) { return n - begin > kSumBlock ? begin + kSumBlock : n; }

template <typename T>
float sumSquares(const T* x, int64_t d) {
  Reg total = Vec::zero();
  for (int64_t b = 0; b < d; b += kSumBlock) {
    const int64_t e = blockEnd(b, d);
    Reg a0 = Vec::zero(), a1 = Vec::zero();
    int64_t i = b;
    for (; i + 2 * kW <= e; i += 2 * kW) {
      const Reg v0 = Vec::load(x + i), v1 = Vec::load(x + i + kW);
      a0 = Vec::fmadd(v0, v0, a0);
      a1 = Vec::fmadd(v1, v1, a1);
    }
    elementwise(i, e, [&](int64_t j, auto io) {
      const Reg v = io.ld(x + j);
      a0 = Vec::fmadd(v, v, a0);
    });
    total = Vec::add(total, Vec::add(a0, a1));
  }
  return Vec::sum(total);
}

template <typename T>
float rstdOf(const T* x, int64_t d, float eps) {
  return 1.0f / std::sqrt(sumSquares(x, d) / static_cast<float>(d) + eps);
}

template <typename T>
void rmsNormForwardT(const RmsNormArgs& a, int64_t begin, int64_t end) {
  const int64_t d = a.dim;
  const T* w = static_cast<const T*>(a.weight);
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * d;
    T* y = static_cast<T*>(a.y) + row * d;
    const float r = rstdOf(x, d, a.eps);
    if (a.rstdOut) a.rstdOut[row] = r;
    const Reg rv = Vec::set1(r);
    elementwise(0, d, [&](int64_t i, auto io) {
      const Reg h = roundTo<T>(Vec::mul(io.ld(x + i), rv));  // HF: weight * h.to(input dtype)
      io.st(y + i, Vec::mul(io.ld(w + i), h));
    });
  }
}

// dx = r (g - h mean(g h)) with g = dy w, h = x r; dweight += dy h (h rounded as the forward did).
template <typename T>
void rmsNormBackwardT(const RmsNormArgs& a, int64_t begin, int64_t end, float* dweight) {
  const int64_t d = a.dim;
  const T* w = static_cast<const T*>(a.weight);
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * d;
    const T* dy = static_cast<const T*>(a.dy) + row * d;
    T* dx = static_cast<T*>(a.dx) + row * d;
    const float r = a.rstdIn ? a.rstdIn[row] : rstdOf(x, d, a.eps);
    Reg acc = Vec::zero();
    elementwise(
        0, d, [&](int64_t i, auto io) { acc = Vec::fmadd(Vec::mul(io.ld(dy + i), io.ld(w + i)), io.ld(x + i), acc); });
    const float meanGh = r * Vec::sum(acc) / static_cast<float>(d);
    const Reg rv = Vec::set1(r), mv = Vec::set1(meanGh);
    elementwise(0, d, [&](int64_t i, auto io) {
      const Reg dyv = io.ld(dy + i);
      const Reg h = Vec::mul(io.ld(x + i), rv);
      const Reg g = Vec::mul(dyv, io.ld(w + i));
      io.st(dx + i, Vec::mul(rv, Vec::sub(g, Vec::mul(h, mv))));
      io.st(dweight + i, Vec::fmadd(dyv, roundTo<T>(h), io.ld(dweight + i)));
    });
  }
}

void rmsNormForward(const RmsNormArgs& a, int64_t begin, int64_t end) {
  byDtype(a.dtype, [&](auto t) { rmsNormForwardT<decltype(t)>(a, begin, end); });
}
void rmsNormBackward(const RmsNormArgs& a, int64_t begin, int64_t end, float* dweight) {
  byDtype(a.dtype, [&](auto t) { rmsNormBackwardT<decltype(t)>(a, begin, end, dweight); });
}

// ---- RoPE (HF split-half) ----

template <typename T>
void ropeT(const RopeArgs& a, int64_t begin, int64_t end) {
  const int64_t d = a.headDim, half = d / 2;
  for (int64_t row = begin; row < end; ++row) {
    T* x;
    int64_t b, s;
    if (row < a.qRows) {
      x = static_cast<T*>(a.q) + row * d;
      b = row / (a.qHeads * a.seq);
      s = row % a.seq;
    } else {
      const int64_t kr = row - a.qRows;
      x = static_cast<T*>(a.k) + kr * d;
      b = kr / (a.kHeads * a.seq);
      s = kr % a.seq;
    }
    const T* c = static_cast<const T*>(a.cos) + b * a.cosBatchStride + s * d;
    const T* sn = static_cast<const T*>(a.sin) + b * a.cosBatchStride + s * d;
    elementwise(0, half, [&](int64_t i, auto io) {
      const Reg x1 = io.ld(x + i), x2 = io.ld(x + half + i);
      const Reg c1 = io.ld(c + i), c2 = io.ld(c + half + i);
      const Reg s1 = io.ld(sn + i), s2 = io.ld(sn + half + i);
      if (!a.backward) {  // x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]
        io.st(x + i, Vec::add(Vec::mul(x1, c1), Vec::mul(Vec::neg(x2), s1)));
        io.st(x + half + i, Vec::add(Vec::mul(x2, c2), Vec::mul(x1, s2)));
      } else {  // the transpose: dx1 = dy1 cos1 + dy2 sin2, dx2 = dy2 cos2 - dy1 sin1
        io.st(x + i, Vec::add(Vec::mul(x1, c1), Vec::mul(x2, s2)));
        io.st(x + half + i, Vec::add(Vec::mul(x2, c2), Vec::mul(Vec::neg(x1), s1)));
      }
    });
  }
}

void rope(const RopeArgs& a, int64_t begin, int64_t end) {
  byDtype(a.dtype, [&](auto t) { ropeT<decltype(t)>(a, begin, end); });
}

// ---- SwiGLU ----

template <typename T>
void swigluForwardT(const SwigluArgs& a, int64_t begin, int64_t end) {
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* out = static_cast<T*>(a.out);
  const Reg one = Vec::set1(1.0f);
  elementwise(begin, end, [&](int64_t i, auto io) {
    const Reg g = io.ld(gate + i);
    const Reg silu = roundTo<T>(Vec::div(g, Vec::add(one, Vec::exp(Vec::neg(g)))));  // torch's silu
    io.st(out + i, Vec::mul(silu, io.ld(up + i)));
  });
}

template <typename T>
void swigluBackwardT(const SwigluArgs& a, int64_t begin, int64_t end) {
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  const T* dout = static_cast<const T*>(a.dout);
  T* dgate = static_cast<T*>(a.dgate);
  T* dup = static_cast<T*>(a.dup);
  const Reg one = Vec::set1(1.0f);
  elementwise(begin, end, [&](int64_t i, auto io) {
    const Reg g = io.ld(gate + i), u = io.ld(up + i), dy = io.ld(dout + i);
    const Reg sig = Vec::div(one, Vec::add(one, Vec::exp(Vec::neg(g))));
    // torch's silu_backward: dy * sig * (1 + g (1 - sig)), dy here the gradient of silu(g).
    const Reg dsilu = roundTo<T>(Vec::mul(dy, u));
    io.st(dgate + i, Vec::mul(Vec::mul(dsilu, sig), Vec::add(one, Vec::mul(g, Vec::sub(one, sig)))));
    io.st(dup + i, Vec::mul(dy, roundTo<T>(Vec::mul(g, sig))));
  });
}

void swigluForward(const SwigluArgs& a, int64_t begin, int64_t end) {
  byDtype(a.dtype, [&](auto t) { swigluForwardT<decltype(t)>(a, begin, end); });
}
void swigluBackward(const SwigluArgs& a, int64_t begin, int64_t end) {
  byDtype(a.dtype, [&](auto t) { swigluBackwardT<decltype(t)>(a, begin, end); });
}

// ---- Over the vocabulary: one row at a time, two passes (max, then sums of exponentials) ----

template <typename T>
float rowMax(const T* x, int64_t v) {
  Reg m0 = Vec::set1(kNegInf), m1 = Vec::set1(kNegInf);
  int64_t i = 0;
  for (; i + 2 * kW <= v; i += 2 * kW) {
    m0 = Vec::max(m0, Vec::load(x + i));
    m1 = Vec::max(m1, Vec::load(x + i + kW));
  }
  elementwise(i, v, [&](int64_t j, auto io) { m0 = Vec::max(m0, io.ld(x + j, kNegInf)); });
  return Vec::maxOf(Vec::max(m0, m1));
}

// sum(e^(x - m)), and sum(e^(x - m) (x - m)) when `weighted` is given.
template <typename T>
float rowSumExp(const T* x, int64_t v, float m, float* weighted) {
  const Reg mv = Vec::set1(m);
  Reg sTotal = Vec::zero(), tTotal = Vec::zero();
  for (int64_t b = 0; b < v; b += kSumBlock) {
    Reg s = Vec::zero(), t = Vec::zero();
    elementwise(b, blockEnd(b, v), [&](int64_t i, auto io) {
      const Reg z = Vec::sub(io.ld(x + i, kNegInf), mv);
      const Reg e = Vec::exp(z);
      s = Vec::add(s, e);
      if (weighted) t = Vec::fmadd(e, Vec::max(z, Vec::set1(-1e30f)), t);  // padding lanes: 0 * finite
    });
    sTotal = Vec::add(sTotal, s);
    tTotal = Vec::add(tTotal, t);
  }
  if (weighted) *weighted = Vec::sum(tTotal);
  return Vec::sum(sTotal);
}

template <typename T>
void crossEntropyBackwardRow(const VocabArgs& a, const T* x, T* dx, int64_t row) {
  const int64_t v = a.vocab;
  const int64_t label = a.labels[row];
  if (label == a.ignoreIndex) {
    elementwise(0, v, [&](int64_t i, auto io) { io.st(dx + i, Vec::zero()); });
    return;
  }
  float lse;
  if (a.lseIn) {
    lse = a.lseIn[row];
  } else {
    const float m = rowMax(x, v);
    lse = m + std::log(rowSumExp(x, v, m, nullptr));
  }
  const Reg lv = Vec::set1(lse), scale = Vec::set1(a.dloss[row]);
  elementwise(0, v, [&](int64_t i, auto io) { io.st(dx + i, Vec::mul(Vec::exp(Vec::sub(io.ld(x + i), lv)), scale)); });
  dx[label] = fromFloat<T>((std::exp(toFloat(x[label]) - lse) - 1.0f) * a.dloss[row]);
}

template <typename T>
void klRow(const T* p, const T* q, int64_t v, float* out) {
  const float mp = rowMax(p, v), mq = rowMax(q, v);
  const Reg mpv = Vec::set1(mp), mqv = Vec::set1(mq);
  Reg spTotal = Vec::zero(), sqTotal = Vec::zero(), tTotal = Vec::zero();
  const int64_t body = v - v % kW;
  for (int64_t b = 0; b < body; b += kSumBlock) {
    Reg sp = Vec::zero(), sq = Vec::zero(), t = Vec::zero();
    for (int64_t i = b, e = blockEnd(b, body); i < e; i += kW) {
      const Reg pv = Vec::load(p + i), qv = Vec::load(q + i);
      const Reg ep = Vec::exp(Vec::sub(pv, mpv));
      sp = Vec::add(sp, ep);
      sq = Vec::add(sq, Vec::exp(Vec::sub(qv, mqv)));
      t = Vec::fmadd(ep, Vec::sub(pv, qv), t);
    }
    spTotal = Vec::add(spTotal, sp);
    sqTotal = Vec::add(sqTotal, sq);
    tTotal = Vec::add(tTotal, t);
  }
  float spt = Vec::sum(spTotal), sqt = Vec::sum(sqTotal), tt = Vec::sum(tTotal);
  for (int64_t i = body; i < v; ++i) {  // the tail in scalar: padding would need a value neutral for p - q too
    const float pi = toFloat(p[i]), qi = toFloat(q[i]);
    const float ep = std::exp(pi - mp);
    spt += ep;
    sqt += std::exp(qi - mq);
    tt += ep * (pi - qi);
  }
  // sum P (p - q) - (lse_p - lse_q)
  *out = tt / spt - ((mp - mq) + (std::log(spt) - std::log(sqt)));
}

template <typename T>
void vocabT(const VocabArgs& a, int64_t begin, int64_t end) {
  const int64_t v = a.vocab;
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.logits) + row * v;
    switch (a.op) {
      case VocabOp::kCrossEntropyForward:
      case VocabOp::kLogprobs: {
        const int64_t label = a.labels[row];
        if (a.op == VocabOp::kCrossEntropyForward && label == a.ignoreIndex) {
          a.out[row] = 0.0f;
          if (a.lseOut) a.lseOut[row] = 0.0f;
          break;
        }
        const float m = rowMax(x, v);
        const float logSum = std::log(rowSumExp(x, v, m, nullptr));
        const float logprob = (toFloat(x[label]) - m) - logSum;  // torch's log_softmax order
        a.out[row] = a.op == VocabOp::kLogprobs ? logprob : -logprob;
        if (a.lseOut) a.lseOut[row] = m + logSum;
        break;
      }
      case VocabOp::kCrossEntropyBackward:
        crossEntropyBackwardRow(a, x, static_cast<T*>(a.dlogits) + row * v, row);
        break;
      case VocabOp::kEntropy: {
        const float m = rowMax(x, v);
        float t = 0.0f;
        const float s = rowSumExp(x, v, m, &t);
        a.out[row] = std::log(s) - t / s;  // -sum P (x - m - log s)
        break;
      }
      case VocabOp::kKlDivergence:
        klRow(x, static_cast<const T*>(a.logitsQ) + row * v, v, a.out + row);
        break;
      case VocabOp::kGreedy: {
        // torch.argmax's pick: the first NaN, else the first of the largest values.
        int64_t best = 0;
        for (int64_t i = 1; i < v && !std::isnan(toFloat(x[best])); ++i) {
          const float xi = toFloat(x[i]);
          if (std::isnan(xi) || xi > toFloat(x[best])) best = i;
        }
        const float m = rowMax(x, v);
        a.tokensOut[row] = best;
        a.out[row] = (toFloat(x[best]) - m) - std::log(rowSumExp(x, v, m, nullptr));
        break;
      }
    }
  }
}

void vocab(const VocabArgs& a, int64_t begin, int64_t end) {
  byDtype(a.dtype, [&](auto t) { vocabT<decltype(t)>(a, begin, end); });
}

// ---- Optimizer steps ----

template <typename F>
inline void byParamAndGrad(const OptimizerTensors& t, F&& f) {
  byDtype(t.paramDtype, [&](auto p) { byDtype(t.gradDtype, [&](auto g) { f(p, g); }); });
}

template <typename P, typename G>
void adamT(const AdamArgs& a, int64_t begin, int64_t end) {
  P* param = static_cast<P*>(a.t.param);
  const G* grad = static_cast<const G*>(a.t.grad);
  float* m = a.t.first;
  float* v = a.t.second;
  const bool lerpLow = a.lerpWeight < 0.5f;
  const Reg w = Vec::set1(lerpLow ? a.lerpWeight : a.lerpWeight - 1.0f);
  const Reg beta2 = Vec::set1(a.beta2), omb2 = Vec::set1(a.oneMinusBeta2);
  const Reg negStep = Vec::set1(a.negStepSize), invBc2Sqrt = Vec::set1(1.0f / a.bc2Sqrt), eps = Vec::set1(a.eps);
  const Reg decay = Vec::set1(a.decay), wd = Vec::set1(a.weightDecay);
  elementwise(begin, end, [&](int64_t i, auto io) {
    Reg p = io.ld(param + i), g = io.ld(grad + i);
    const Reg m0 = io.ld(m + i), v0 = io.ld(v + i);
    if (a.hasWeightDecay) {
      if (a.decoupled) {
        p = Vec::mul(p, decay);  // param.mul_(1 - lr * wd)
      } else {
        g = Vec::fmadd(p, wd, g);  // grad.add(param, alpha=wd)
      }
    }
    // exp_avg.lerp_(grad, 1 - beta1), as ATen's lerp computes it
    const Reg m1 = Vec::fmadd(w, Vec::sub(g, m0), lerpLow ? m0 : g);
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    const Reg v1 = Vec::add(Vec::mul(v0, beta2), Vec::mul(Vec::mul(omb2, g), g));
    // denom = exp_avg_sq.sqrt() / sqrt(bc2) + eps (by a reciprocal: one division less per element,
    // within an ulp of torch's); param.addcdiv_(exp_avg, denom, value=-lr / bc1)
    const Reg denom = Vec::fmadd(Vec::sqrt(v1), invBc2Sqrt, eps);
    p = Vec::add(p, Vec::div(Vec::mul(negStep, m1), denom));
    io.st(param + i, p);
    io.st(m + i, m1);
    io.st(v + i, v1);
  });
}

template <typename P, typename G>
void lionT(const LionArgs& a, int64_t begin, int64_t end) {
  P* param = static_cast<P*>(a.t.param);
  const G* grad = static_cast<const G*>(a.t.grad);
  float* m = a.t.first;
  const Reg beta1 = Vec::set1(a.beta1), omb1 = Vec::set1(a.oneMinusBeta1);
  const Reg beta2 = Vec::set1(a.beta2), omb2 = Vec::set1(a.oneMinusBeta2);
  const Reg negLr = Vec::set1(a.negLr), decay = Vec::set1(a.decay);
  elementwise(begin, end, [&](int64_t i, auto io) {
    Reg p = io.ld(param + i);
    const Reg g = io.ld(grad + i), m0 = io.ld(m + i);
    const Reg update = Vec::sign(Vec::fmadd(g, omb1, Vec::mul(m0, beta1)));
    if (a.hasWeightDecay) p = Vec::mul(p, decay);
    p = Vec::fmadd(update, negLr, p);
    io.st(param + i, p);
    io.st(m + i, Vec::fmadd(g, omb2, Vec::mul(m0, beta2)));
  });
}

template <typename P, typename G>
void adagradT(const AdagradArgs& a, int64_t begin, int64_t end) {
  P* param = static_cast<P*>(a.t.param);
  const G* grad = static_cast<const G*>(a.t.grad);
  float* sum = a.t.first;
  const Reg negLr = Vec::set1(a.negLr), eps = Vec::set1(a.eps), wd = Vec::set1(a.weightDecay);
  elementwise(begin, end, [&](int64_t i, auto io) {
    Reg p = io.ld(param + i), g = io.ld(grad + i);
    if (a.hasWeightDecay) g = Vec::fmadd(p, wd, g);          // grad.add(param, alpha=wd)
    const Reg s = Vec::add(io.ld(sum + i), Vec::mul(g, g));  // state_sum.addcmul_(grad, grad, value=1)
    const Reg denom = Vec::add(Vec::sqrt(s), eps);           // std = state_sum.sqrt().add_(eps)
    p = Vec::add(p, Vec::div(Vec::mul(negLr, g), denom));    // param.addcdiv_(grad, std, value=-lr)
    io.st(param + i, p);
    io.st(sum + i, s);
  });
}

void adam(const AdamArgs& a, int64_t begin, int64_t end) {
  byParamAndGrad(a.t, [&](auto p, auto g) { adamT<decltype(p), decltype(g)>(a, begin, end); });
}
void lion(const LionArgs& a, int64_t begin, int64_t end) {
  byParamAndGrad(a.t, [&](auto p, auto g) { lionT<decltype(p), decltype(g)>(a, begin, end); });
}
void adagrad(const AdagradArgs& a, int64_t begin, int64_t end) {
  byParamAndGrad(a.t, [&](auto p, auto g) { adagradT<decltype(p), decltype(g)>(a, begin, end); });
}

const IsaKernels kKernels{
    .name = kIsaName,
    .rmsNormForward = rmsNormForward,
    .rmsNormBackward = rmsNormBackward,
    .rope = rope,
    .swigluForward = swigluForward,
    .swigluBackward = swigluBackward,
    .vocab = vocab,
    .adam = adam,
    .lion = lion,
    .adagrad = adagrad,
};
