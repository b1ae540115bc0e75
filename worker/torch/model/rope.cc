#include "worker/torch/model/rope.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

namespace loom::worker {

namespace {

// YaRN (transformers' _compute_yarn_parameters): frequencies below the correction range are
// interpolated (divided by `factor`), those above kept, with a linear ramp between.
at::Tensor yarnInverseFrequencies(const planner::RopeConfig& rope, int64_t dim, const at::Tensor& extrapolation) {
  auto correctionDim = [&](double rotations) {
    return dim * std::log(static_cast<double>(rope.originalMaxPositions) / (rotations * 2 * M_PI)) /
           (2 * std::log(rope.theta));
  };
  double low = correctionDim(rope.betaFast), high = correctionDim(rope.betaSlow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // as transformers avoids a zero-width ramp
  const at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  const at::Tensor keep = 1 - ramp;  // the share of the extrapolated (unscaled) frequency
  const at::Tensor interpolation = extrapolation / rope.factor;
  return interpolation * (1 - keep) + extrapolation * keep;
}

}  // namespace

double yarnMscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double ropeAttentionFactor(const planner::ModelConfig& config) {
  const auto& rope = config.rope;
  if (rope.type != planner::RopeConfig::Type::kYarn) return 1.0;
  if (rope.attentionFactor != 0) return rope.attentionFactor;
  if (rope.mscale != 0 && rope.mscaleAllDim != 0)
    return yarnMscale(rope.factor, rope.mscale) / yarnMscale(rope.factor, rope.mscaleAllDim);
  return yarnMscale(rope.factor, 1.0);
}

at::Tensor ropeInverseFrequencies(const planner::ModelConfig& config) {
  using Type = planner::RopeConfig::Type;
  const auto& rope = config.rope;
  const int64_t dim = config.headDim;
  at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  at::Tensor inv = 1.0 / at::pow(rope.theta, exponents);
  if (rope.type == Type::kLinear) return inv / rope.factor;
  if (rope.type == Type::kYarn) return yarnInverseFrequencies(rope, dim, inv);
  if (rope.type != Type::kLlama3) return inv;
  // Llama 3: long wavelengths slowed by `factor`, short ones kept, the band between blended.
  const double oldContext = static_cast<double>(rope.originalMaxPositions);
  const double lowFreqWavelen = oldContext / rope.lowFreqFactor;
  const double highFreqWavelen = oldContext / rope.highFreqFactor;
  at::Tensor wavelen = 2 * M_PI / inv;
  at::Tensor scaled = at::where(wavelen > lowFreqWavelen, inv / rope.factor, inv);
  at::Tensor smooth = (oldContext / wavelen - rope.lowFreqFactor) / (rope.highFreqFactor - rope.lowFreqFactor);
  at::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
  at::Tensor medium = (wavelen < highFreqWavelen).logical_not().logical_and((wavelen > lowFreqWavelen).logical_not());
  return at::where(medium, smoothed, scaled);
}

}  // namespace loom::worker
