#include "worker/torch/model/latent_attention.h"

#include <cmath>

#include <ATen/ATen.h>

#include "worker/torch/model/ops.h"
#include "worker/torch/model/rope.h"

namespace loom::worker {

namespace {

// Rotary dimensions (x0, x1), (x2, x3), ... -> (x0, x2, ..., x1, x3, ...).
at::Tensor pairsToHalves(const at::Tensor& x) {
  return at::cat({x.slice(-1, 0, {}, 2), x.slice(-1, 1, {}, 2)}, -1);
}

}  // namespace

at::Tensor latentAttention(const planner::ModelConfig& config, const LatentAttentionWeights& w, const at::Tensor& x,
                           int64_t heads, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& allowed,
                           LinearFn linear) {
  const planner::MlaConfig& m = config.mla;
  const int64_t b = x.size(0), s = x.size(1);
  const at::Tensor queries =
      w.q.defined() ? linear(x, w.q, {})
                    : linear(ops().rmsNorm(linear(x, w.qA, w.qABias), w.qANorm, config.rmsNormEps), w.qB, {});
  const at::Tensor q = queries.view({b, s, heads, m.qkHeadDim()}).transpose(1, 2);  // [B, h, S, dqk]
  at::Tensor qPass = q.narrow(-1, 0, m.qkNopeHeadDim), qRot = q.narrow(-1, m.qkNopeHeadDim, m.qkRopeHeadDim);

  const at::Tensor compressed = linear(x, w.kvA, w.kvABias);  // [B, S, kv_lora_rank + r]
  const at::Tensor latent = ops().rmsNorm(compressed.narrow(-1, 0, m.kvLoraRank), w.kvANorm, config.rmsNormEps);
  at::Tensor kRot = compressed.narrow(-1, m.kvLoraRank, m.qkRopeHeadDim).unsqueeze(1);  // [B, 1, S, r]
  if (m.ropeInterleave) {
    qRot = pairsToHalves(qRot);
    kRot = pairsToHalves(kRot);
  }
  std::tie(qRot, kRot) = ops().rope(qRot, kRot, cos, sin);

  const at::Tensor kv = linear(latent, w.kvB, {}).view({b, s, heads, m.qkNopeHeadDim + m.vHeadDim}).transpose(1, 2);
  const at::Tensor kPass = kv.narrow(-1, 0, m.qkNopeHeadDim), v = kv.narrow(-1, m.qkNopeHeadDim, m.vHeadDim);
  at::Tensor query = at::cat({qPass, qRot}, -1);
  const at::Tensor key = at::cat({kPass, kRot.expand({b, heads, s, m.qkRopeHeadDim})}, -1);
  // The attention op scales by 1/sqrt(qk_head_dim), HF's scale before yarn's mscale^2.
  const planner::RopeConfig& rope = config.rope;
  if (rope.type == planner::RopeConfig::Type::kYarn && rope.mscaleAllDim != 0) {
    const double mscale = yarnMscale(rope.factor, rope.mscaleAllDim);
    query = query * (mscale * mscale);
  }
  const at::Tensor out = ops().attention(query, key, v.contiguous(), allowed);  // [B, h, S, dv]
  return out.transpose(1, 2).reshape({b, s, heads * m.vHeadDim});
}

}  // namespace loom::worker
