#include "kernels/cpu/portable_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace loom::kernels::cpu {
namespace {

// Rounds an fp32 intermediate to T, as torch does after each op of a bf16 computation; fp32
// stays as it is.
template <typename T>
float rounded(float v) {
  return toFloat(fromFloat<T>(v));
}

template <typename Fn>
void byType(loom_dtype dtype, Fn&& fn) {
  if (dtype == LOOM_DTYPE_BF16) {
    fn(Bf16{});
  } else {
    fn(0.0f);
  }
}

template <typename T>
void softmaxForwardRows(const MaskedSoftmaxArgs& a, int64_t begin, int64_t end) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = begin; r < end; ++r) {
    const T* x = static_cast<const T*>(a.x) + r * a.cols;
    const uint8_t* mask = a.mask ? a.mask + r * a.cols : nullptr;
    T* y = static_cast<T*>(a.out) + r * a.cols;
    float max = kNegInf;
    for (int64_t c = 0; c < a.cols; ++c)
      if (!mask || mask[c]) max = std::max(max, toFloat(x[c]) * a.scale);
    if (max == kNegInf) {  // nothing left in the row
      std::fill(y, y + a.cols, fromFloat<T>(0.0f));
      continue;
    }
    // Summed in double: the normalizer's rounding then does not grow with the row's length.
    double sum = 0;
    for (int64_t c = 0; c < a.cols; ++c)
      if (!mask || mask[c]) sum += std::exp(toFloat(x[c]) * a.scale - max);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t c = 0; c < a.cols; ++c)
      y[c] = fromFloat<T>(!mask || mask[c] ? std::exp(toFloat(x[c]) * a.scale - max) * inv : 0.0f);
  }
}

template <typename T>
void softmaxBackwardRows(const MaskedSoftmaxArgs& a, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* y = static_cast<const T*>(a.y) + r * a.cols;
    const T* dy = static_cast<const T*>(a.dy) + r * a.cols;
    T* dx = static_cast<T*>(a.out) + r * a.cols;
    double dot = 0;
    for (int64_t c = 0; c < a.cols; ++c) dot += static_cast<double>(toFloat(dy[c])) * toFloat(y[c]);
    const float d = static_cast<float>(dot);
    for (int64_t c = 0; c < a.cols; ++c) dx[c] = fromFloat<T>(a.scale * toFloat(y[c]) * (toFloat(dy[c]) - d));
  }
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

template <typename T>
void clampedForward(const ClampedSwigluArgs& a, int64_t begin, int64_t end) {
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* out = static_cast<T*>(a.out);
  for (int64_t i = begin; i < end; ++i) {
    const float g = std::min(toFloat(gate[i]), a.limit);
    const float u = std::clamp(toFloat(up[i]), -a.limit, a.limit);
    // The reference's order of ops, each rounded in bf16: sigmoid(g * alpha), g * that, u + 1.
    const float glu = rounded<T>(g * rounded<T>(sigmoid(rounded<T>(g * a.alpha))));
    out[i] = fromFloat<T>(rounded<T>(u + 1.0f) * glu);
  }
}

template <typename T>
void clampedBackward(const ClampedSwigluArgs& a, int64_t begin, int64_t end) {
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  const T* dout = static_cast<const T*>(a.dout);
  T* dgate = static_cast<T*>(a.dgate);
  T* dup = static_cast<T*>(a.dup);
  for (int64_t i = begin; i < end; ++i) {
    const float gateIn = toFloat(gate[i]), upIn = toFloat(up[i]), d = toFloat(dout[i]);
    const float g = std::min(gateIn, a.limit);
    const float u = std::clamp(upIn, -a.limit, a.limit);
    const float s = sigmoid(g * a.alpha);
    // d/dg [g sigmoid(alpha g)] = s + alpha g s (1 - s); torch.clamp passes the gradient where
    // the input lies within the bounds, ends included.
    const float dglu = d * (u + 1.0f);
    dgate[i] = fromFloat<T>(gateIn <= a.limit ? dglu * (s + a.alpha * g * s * (1.0f - s)) : 0.0f);
    dup[i] = fromFloat<T>(upIn >= -a.limit && upIn <= a.limit ? d * g * s : 0.0f);
  }
}

template <typename T>
void addT(const T* x, const T* residual, T* sum, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) sum[i] = fromFloat<T>(toFloat(x[i]) + toFloat(residual[i]));
}

}  // namespace

void maskedSoftmaxForwardRows(const MaskedSoftmaxArgs& a, int64_t begin, int64_t end) {
  byType(a.dtype, [&](auto t) { softmaxForwardRows<decltype(t)>(a, begin, end); });
}
void maskedSoftmaxBackwardRows(const MaskedSoftmaxArgs& a, int64_t begin, int64_t end) {
  byType(a.dtype, [&](auto t) { softmaxBackwardRows<decltype(t)>(a, begin, end); });
}
void clampedSwigluForwardRange(const ClampedSwigluArgs& a, int64_t begin, int64_t end) {
  byType(a.dtype, [&](auto t) { clampedForward<decltype(t)>(a, begin, end); });
}
void clampedSwigluBackwardRange(const ClampedSwigluArgs& a, int64_t begin, int64_t end) {
  byType(a.dtype, [&](auto t) { clampedBackward<decltype(t)>(a, begin, end); });
}

namespace {

template <typename T>
void pagedRows(const PagedDecodeArgs& a, int64_t begin, int64_t end) {
  const int64_t group = a.heads / a.kvHeads, dim = a.dim;
  std::vector<float> query(dim), acc(dim);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t seq = r / a.heads, head = r % a.heads, kvHead = head / group;
    const T* q = static_cast<const T*>(a.q) + r * dim;
    for (int64_t d = 0; d < dim; ++d) query[d] = toFloat(q[d]) * a.scale;
    std::fill(acc.begin(), acc.end(), 0.0f);
    const int64_t context = a.contextLens[seq];
    const int64_t first = a.window > 0 && context > a.window ? context - a.window : 0;
    float max = -std::numeric_limits<float>::infinity(), sum = 0;
    for (int64_t p = first; p < context; ++p) {
      const int64_t slot = a.blockTables[seq * a.maxBlocks + p / a.blockSize] * a.blockSize + p % a.blockSize;
      const int64_t offset = (slot * a.kvHeads + kvHead) * dim;
      const T* k = static_cast<const T*>(a.keyCache) + offset;
      const T* v = static_cast<const T*>(a.valueCache) + offset;
      float score = 0;
      for (int64_t d = 0; d < dim; ++d) score += query[d] * toFloat(k[d]);
      const float next = std::max(max, score);
      const float correction = std::exp(max - next), weight = std::exp(score - next);
      sum = sum * correction + weight;
      for (int64_t d = 0; d < dim; ++d) acc[d] = acc[d] * correction + weight * toFloat(v[d]);
      max = next;
    }
    T* out = static_cast<T*>(a.out) + r * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = fromFloat<T>(acc[d] / sum);
  }
}

// One head's row: HF's RMSNorm (with weights; fp32 statistics, h rounded to T, then the weight's
// product rounded to T), then the split-half rotation with products and sums rounded to T as the
// reference's tensor ops round them.
template <typename T>
void ropeRow(const T* x, const T* norm, float eps, const T* cos, const T* sin, int64_t dim, T* out) {
  const int64_t half = dim / 2;
  std::vector<float> v(static_cast<size_t>(dim));
  for (int64_t i = 0; i < dim; ++i) v[i] = toFloat(x[i]);
  if (norm) {
    float ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += v[i] * v[i];
    const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) v[i] = rounded<T>(toFloat(norm[i]) * rounded<T>(v[i] * rstd));
  }
  auto mul = [](float a, float b) { return rounded<T>(a * b); };
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = v[i], x2 = v[half + i];
    out[i] = fromFloat<T>(mul(x1, toFloat(cos[i])) + mul(-x2, toFloat(sin[i])));
    out[half + i] = fromFloat<T>(mul(x2, toFloat(cos[half + i])) + mul(x1, toFloat(sin[half + i])));
  }
}

template <typename T>
void ropeKvWriteT(const RopeKvWriteArgs& a, int64_t begin, int64_t end) {
  const int64_t d = a.dim;
  for (int64_t t = begin; t < end; ++t) {
    const T* cos = static_cast<const T*>(a.cos) + t * d;
    const T* sin = static_cast<const T*>(a.sin) + t * d;
    const T* q = static_cast<const T*>(a.q) + t * a.qStride;
    for (int64_t h = 0; h < a.heads; ++h)
      ropeRow(q + h * d, static_cast<const T*>(a.qNorm), a.eps, cos, sin, d,
              static_cast<T*>(a.qOut) + (t * a.heads + h) * d);
    const T* k = static_cast<const T*>(a.k) + t * a.kvStride;
    const T* v = static_cast<const T*>(a.v) + t * a.kvStride;
    const int64_t slot = a.slots[t] * a.kvHeads * d;
    for (int64_t h = 0; h < a.kvHeads; ++h) {
      ropeRow(k + h * d, static_cast<const T*>(a.kNorm), a.eps, cos, sin, d, static_cast<T*>(a.keyCache) + slot + h * d);
      std::copy(v + h * d, v + (h + 1) * d, static_cast<T*>(a.valueCache) + slot + h * d);
    }
  }
}

}  // namespace

void ropeKvWriteTokens(const RopeKvWriteArgs& a, int64_t begin, int64_t end) {
  byType(a.dtype, [&](auto t) { ropeKvWriteT<decltype(t)>(a, begin, end); });
}

void pagedDecodeRows(const PagedDecodeArgs& a, int64_t begin, int64_t end) {
  byType(a.dtype, [&](auto t) { pagedRows<decltype(t)>(a, begin, end); });
}

void addRange(loom_dtype dtype, const void* x, const void* residual, void* sum, int64_t begin, int64_t end) {
  byType(dtype, [&](auto t) {
    using T = decltype(t);
    addT(static_cast<const T*>(x), static_cast<const T*>(residual), static_cast<T*>(sum), begin, end);
  });
}

}  // namespace loom::kernels::cpu
