// The CUDA plugin's ops over the vocabulary: cross-entropy forward and backward, logprobs,
// entropy, KL and greedy decoding's pick with its logprob. One block per row reads the row's
// logits in dtype once per pass and keeps only running statistics in fp32: the maximum and the
// sum of exponentials below it (online logsumexp: a new maximum rescales the sum), plus what
// entropy, KL and the greedy pick need beside them. The blocks' statistics combine in a fixed
// tree (device_common.cuh), so results are deterministic.
#include <climits>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace loom::kernels::gpu {
namespace {

constexpr int kVocabThreadCap = 512;

// sum(e^(x - m)) over the elements seen, m their maximum. Plain fields: it lives in shared memory.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -kInf) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

template <int V>
__device__ __forceinline__ float chunkMax(const float (&v)[V], int count) {
  float cm = -kInf;
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (k < count) cm = fmaxf(cm, v[k]);
  return cm;
}

template <int V>
__device__ __forceinline__ void add(MaxSum& st, const float (&v)[V], int count) {
  const float cm = chunkMax(v, count);
  if (cm > st.m) {  // one rescale per chunk, not per element
    st.s *= expf(st.m - cm);
    st.m = cm;
  }
  if (st.m == -kInf) return;  // only -inf so far: nothing to add
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (k < count) st.s += expf(v[k] - st.m);
}

// Entropy's statistics: MaxSum and t = sum(e^(x - m) (x - m)). Moving m to m' scales both
// sums by e^(m - m') and adds (m - m') s to t.
struct MaxSumT {
  float m, s, t;
};
__device__ __forceinline__ void rescale(MaxSumT& st, float m) {
  if (st.m == -kInf) {
    st.m = m;
    return;
  }
  const float d = st.m - m, e = expf(d);
  st.t = e * (st.t + d * st.s);
  st.s *= e;
  st.m = m;
}
__device__ __forceinline__ MaxSumT combine(MaxSumT a, MaxSumT b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -kInf) return {m, 0.0f, 0.0f};
  rescale(a, m);
  rescale(b, m);
  return {m, a.s + b.s, a.t + b.t};
}

// KL's statistics: P's and Q's MaxSum and t = sum(e^(p - mp) (p - q)), which scales with P's sum.
struct KlStats {
  float mp, sp, mq, sq, t;
};
__device__ __forceinline__ float scaleTo(float from, float to) { return from == -kInf ? 0.0f : expf(from - to); }
__device__ __forceinline__ KlStats combine(KlStats a, KlStats b) {
  const float mp = fmaxf(a.mp, b.mp), mq = fmaxf(a.mq, b.mq);
  KlStats r{mp, 0.0f, mq, 0.0f, 0.0f};
  if (mp != -kInf) {
    const float ea = scaleTo(a.mp, mp), eb = scaleTo(b.mp, mp);
    r.sp = a.sp * ea + b.sp * eb;
    r.t = a.t * ea + b.t * eb;
  }
  if (mq != -kInf) r.sq = a.sq * scaleTo(a.mq, mq) + b.sq * scaleTo(b.mq, mq);
  return r;
}

// Greedy decoding's statistics: MaxSum and the argmax, its value and index (an int's bits: the
// reductions move floats).
struct Greedy {
  MaxSum ms;
  float best;
  int index;
};
// Whether value a at index ia comes before b at ib in torch.argmax's order: a NaN first, then the
// larger value, then the smaller index.
__device__ __forceinline__ bool precedes(float a, int ia, float b, int ib) {
  const bool aNan = a != a, bNan = b != b;
  if (aNan != bNan) return aNan;
  if (!aNan && a != b) return a > b;
  return ia < ib;
}
__device__ __forceinline__ Greedy combine(Greedy a, Greedy b) {
  const bool first = precedes(a.best, a.index, b.best, b.index);
  return {combine(a.ms, b.ms), first ? a.best : b.best, first ? a.index : b.index};
}

template <typename T>
__device__ __forceinline__ MaxSum rowMaxSum(const T* __restrict__ x, int64_t vocab) {
  constexpr int V = kVec<T>;
  MaxSum st{-kInf, 0.0f};
  forEachChunk(x, vocab, [&](int64_t i, int count) {
    float v[V];
    loadChunk(x + i, count, v);
    add(st, v, count);
  });
  return blockReduce(st, MaxSum{-kInf, 0.0f}, [](MaxSum a, MaxSum b) { return combine(a, b); });
}

// A label outside [0, vocab): one store of the record (cuda_kernels.h) into host memory.
__device__ void recordBadLabel(unsigned long long* record, VocabOp op, int64_t row, int64_t label) {
  if (!record) return;
  const uint64_t r = static_cast<uint64_t>(row < kBadRowMax ? row : kBadRowMax);
  const int64_t clamped = label < INT_MIN ? INT_MIN : (label > INT_MAX ? INT_MAX : label);
  const uint64_t word = kBadLabelSet | (static_cast<uint64_t>(static_cast<int>(op) + 1) << 60) | (r << 32) |
                        static_cast<uint32_t>(static_cast<int32_t>(clamped));
  *reinterpret_cast<volatile unsigned long long*>(record) = word;
  __threadfence_system();
}

// What a row's label says: Skip (ignored), Bad (outside the vocabulary: record it), or Use.
enum class LabelUse { kUse, kSkip, kBad };
__device__ __forceinline__ LabelUse labelUse(const VocabArgs& a, int64_t row, int64_t label) {
  if (a.ignoring && label == a.ignoreIndex) return LabelUse::kSkip;
  if (label >= 0 && label < a.vocab) return LabelUse::kUse;
  if (threadIdx.x == 0) recordBadLabel(a.badLabel, a.op, row, label);
  return LabelUse::kBad;
}

// Cross-entropy forward and logprobs: loss = lse - x[label], logprob = (x[label] - m) - log(s)
// (torch's log_softmax order).
template <typename T>
__global__ void __launch_bounds__(kVocabThreadCap) labelledRowKernel(VocabArgs a) {
  const int64_t row = blockIdx.x;
  const int64_t label = a.labels[row];
  const LabelUse use = labelUse(a, row, label);
  if (use != LabelUse::kUse) {
    if (threadIdx.x == 0) {
      const float v = use == LabelUse::kSkip ? 0.0f : __int_as_float(0x7fc00000);  // NaN marks the bad row
      a.out[row] = v;
      if (a.lseOut) a.lseOut[row] = v;
    }
    return;
  }
  const T* x = static_cast<const T*>(a.logits) + row * a.vocab;
  const MaxSum st = rowMaxSum(x, a.vocab);
  if (threadIdx.x == 0) {
    const float logSum = logf(st.s);
    const float logprob = (toFloat(x[label]) - st.m) - logSum;
    a.out[row] = a.op == VocabOp::kLogprobs ? logprob : -logprob;
    if (a.lseOut) a.lseOut[row] = st.m + logSum;
  }
}

// Greedy decoding: the row's argmax and its logprob, (x[argmax] - m) - log(s), in one pass.
template <typename T>
__global__ void __launch_bounds__(kVocabThreadCap) greedyRowKernel(VocabArgs a) {
  constexpr int V = kVec<T>;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.logits) + row * a.vocab;
  Greedy st{{-kInf, 0.0f}, -kInf, INT_MAX};
  forEachChunk(x, a.vocab, [&](int64_t i, int count) {
    float v[V];
    loadChunk(x + i, count, v);
    add(st.ms, v, count);
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (k < count && precedes(v[k], static_cast<int>(i) + k, st.best, st.index))
        st.best = v[k], st.index = static_cast<int>(i) + k;
  });
  st = blockReduce(st, Greedy{{-kInf, 0.0f}, -kInf, INT_MAX}, [](Greedy u, Greedy w) { return combine(u, w); });
  if (threadIdx.x == 0) {
    a.tokensOut[row] = st.index;
    a.out[row] = (st.best - st.ms.m) - logf(st.ms.s);
  }
}

// dlogits = dloss (softmax - onehot(label)); zero rows where ignored, NaN rows where the label is bad.
template <typename T>
__global__ void __launch_bounds__(kVocabThreadCap) crossEntropyBackwardKernel(VocabArgs a) {
  constexpr int V = kVec<T>;
  const int64_t row = blockIdx.x;
  const int64_t label = a.labels[row];
  const T* x = static_cast<const T*>(a.logits) + row * a.vocab;
  T* dx = static_cast<T*>(a.dlogits) + row * a.vocab;
  const LabelUse use = labelUse(a, row, label);
  if (use != LabelUse::kUse) {
    const float fill = use == LabelUse::kSkip ? 0.0f : __int_as_float(0x7fc00000);
    forEachChunk(x, a.vocab, [&](int64_t i, int count) {
      float out[V];
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = fill;
      storeChunk(dx + i, count, out);
    });
    return;
  }
  float lse;
  if (a.lseIn) {
    lse = a.lseIn[row];
  } else {
    const MaxSum st = rowMaxSum(x, a.vocab);
    lse = st.m + logf(st.s);
  }
  const float scale = a.dloss[row];
  forEachChunk(x, a.vocab, [&](int64_t i, int count) {
    float v[V], out[V];
    loadChunk(x + i, count, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float p = expf(v[k] - lse);
      out[k] = (i + k == label ? p - 1.0f : p) * scale;
    }
    storeChunk(dx + i, count, out);
  });
}

// -sum(P log P) = log(s) - t / s.
template <typename T>
__global__ void __launch_bounds__(kVocabThreadCap) entropyKernel(VocabArgs a) {
  constexpr int V = kVec<T>;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.logits) + row * a.vocab;
  MaxSumT st{-kInf, 0.0f, 0.0f};
  forEachChunk(x, a.vocab, [&](int64_t i, int count) {
    float v[V];
    loadChunk(x + i, count, v);
    const float cm = chunkMax(v, count);
    if (cm > st.m) rescale(st, cm);
    if (st.m == -kInf) return;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (k >= count) continue;
      const float z = v[k] - st.m, e = expf(z);
      st.s += e;
      if (e > 0.0f) st.t = fmaf(e, z, st.t);  // e = 0 at z = -inf, where e z would be NaN
    }
  });
  st = blockReduce(st, MaxSumT{-kInf, 0.0f, 0.0f}, [](MaxSumT u, MaxSumT w) { return combine(u, w); });
  if (threadIdx.x == 0) a.out[row] = logf(st.s) - st.t / st.s;
}

// KL(P || Q) = sum P (p - q) - (lse_p - lse_q) = t / sp - ((mp - mq) + (log sp - log sq)).
template <typename T>
__global__ void __launch_bounds__(kVocabThreadCap) klKernel(VocabArgs a) {
  constexpr int V = kVec<T>;
  const int64_t row = blockIdx.x;
  const T* p = static_cast<const T*>(a.logits) + row * a.vocab;
  const T* q = static_cast<const T*>(a.logitsQ) + row * a.vocab;
  KlStats st{-kInf, 0.0f, -kInf, 0.0f, 0.0f};
  forEachChunk(p, a.vocab, [&](int64_t i, int count) {
    float pv[V], qv[V];
    loadChunk(p + i, count, pv);
    loadChunk(q + i, count, qv);
    const float cmp = chunkMax(pv, count), cmq = chunkMax(qv, count);
    if (cmp > st.mp) {
      const float e = scaleTo(st.mp, cmp);
      st.sp *= e;
      st.t *= e;
      st.mp = cmp;
    }
    if (cmq > st.mq) {
      st.sq *= scaleTo(st.mq, cmq);
      st.mq = cmq;
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (k >= count) continue;
      const float ep = st.mp == -kInf ? 0.0f : expf(pv[k] - st.mp);
      st.sp += ep;
      if (st.mq != -kInf) st.sq += expf(qv[k] - st.mq);
      if (ep > 0.0f) st.t = fmaf(ep, pv[k] - qv[k], st.t);
    }
  });
  st = blockReduce(st, KlStats{-kInf, 0.0f, -kInf, 0.0f, 0.0f}, [](KlStats u, KlStats w) { return combine(u, w); });
  if (threadIdx.x == 0) a.out[row] = st.t / st.sp - ((st.mp - st.mq) + (logf(st.sp) - logf(st.sq)));
}

}  // namespace

cudaError_t launchVocab(const VocabArgs& a, cudaStream_t stream) {
  byDtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int threads = rowThreads((a.vocab + kVec<T> - 1) / kVec<T>, kVocabThreadCap);
    const auto rows = static_cast<unsigned>(a.rows);
    switch (a.op) {
      case VocabOp::kCrossEntropyForward:
      case VocabOp::kLogprobs:
        labelledRowKernel<T><<<rows, threads, 0, stream>>>(a);
        break;
      case VocabOp::kCrossEntropyBackward:
        crossEntropyBackwardKernel<T><<<rows, threads, 0, stream>>>(a);
        break;
      case VocabOp::kEntropy:
        entropyKernel<T><<<rows, threads, 0, stream>>>(a);
        break;
      case VocabOp::kKlDivergence:
        klKernel<T><<<rows, threads, 0, stream>>>(a);
        break;
      case VocabOp::kGreedy:
        greedyRowKernel<T><<<rows, threads, 0, stream>>>(a);
        break;
    }
  });
  return cudaGetLastError();
}

}  // namespace loom::kernels::gpu
