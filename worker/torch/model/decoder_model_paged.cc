// DecoderModel's rollout forward: the step's tokens of many sequences, flat, with keys and values
// in the paged KV cache (paged_kv.h) and attention over it (paged_attention.h).
#include "worker/torch/model/decoder_model.h"

#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "worker/torch/model/ops.h"
#include "worker/torch/parallel/tensor_parallel.h"

namespace loom::worker {

void PagedKvCache::copyBlocks(const at::Tensor& from, const at::Tensor& to) {
  if (!from.defined() || from.numel() == 0) return;
  for (auto* layers : {&keys, &values})
    for (at::Tensor& cache : *layers) cache.index_copy_(0, to, cache.index_select(0, from));
}

int64_t DecoderModel::kvCacheBytesPerBlock(int64_t blockSize) const {
  return 2 * config_.numLayers * blockSize * kvHeads_ * config_.headDim * at::elementSize(dtype_);
}

PagedKvCache DecoderModel::createKvCache(int64_t numBlocks, int64_t blockSize, int64_t maxModelLen) const {
  PagedKvCache cache{.keys = {}, .values = {}, .blockSize = blockSize, .maxModelLen = maxModelLen};
  const auto options = at::TensorOptions().dtype(dtype_).device(device_);
  for (int64_t l = 0; l < config_.numLayers; ++l) {
    // Zeroed: a padded block-table entry points at block 0, whose keys the mask hides but whose
    // values still enter the weighted sum with weight 0 — NaN garbage there would poison it.
    cache.keys.push_back(at::zeros({numBlocks, blockSize, kvHeads_, config_.headDim}, options));
    cache.values.push_back(at::zeros({numBlocks, blockSize, kvHeads_, config_.headDim}, options));
  }
  return cache;
}

void DecoderModel::fuseProjections() {
  at::NoGradGuard noGrad;
  // Rows of one tensor for the named parameters, which become views of it; undefined unless
  // every one of them is held.
  auto fuse = [&](const std::vector<std::string>& names, std::vector<at::Tensor*> fields) {
    std::vector<at::Tensor*> held;
    for (const std::string& name : names) {
      auto it = index_.find(name);
      if (it == index_.end()) return at::Tensor();
      held.push_back(&parameters_[it->second].second);
    }
    std::vector<at::Tensor> parts;
    for (at::Tensor* t : held) parts.push_back(*t);
    const at::Tensor whole = at::cat(parts, 0);
    parts.clear();
    for (size_t i = 0, row = 0; i < held.size(); ++i) {
      const int64_t rows = held[i]->size(0);
      *held[i] = *fields[i] = whole.narrow(0, static_cast<int64_t>(row), rows);
      row += static_cast<size_t>(rows);
    }
    return whole;
  };
  for (Layer& l : layers_) {
    const std::string p = fmt::format("model.layers.{}.", l.index);
    const std::string a = p + "self_attn.", m = p + "mlp.";
    if (!config_.isMla() && l.qBias.defined() == l.kBias.defined() && l.kBias.defined() == l.vBias.defined()) {
      l.qkv = fuse({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, {&l.q, &l.k, &l.v});
      if (l.qkv.defined() && l.qBias.defined())
        l.qkvBias = fuse({a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}, {&l.qBias, &l.kBias, &l.vBias});
    }
    if (!l.moe && l.gateBias.defined() == l.upBias.defined()) {
      l.gateUp = fuse({m + "gate_proj.weight", m + "up_proj.weight"}, {&l.gate, &l.up});
      if (l.gateUp.defined() && l.gateBias.defined())
        l.gateUpBias = fuse({m + "gate_proj.bias", m + "up_proj.bias"}, {&l.gateBias, &l.upBias});
    }
  }
}

at::Tensor DecoderModel::pagedAttentionBlock(const Layer& l, const at::Tensor& input) {
  const int64_t t = input.size(1), d = config_.headDim;
  const at::Tensor x = copyToTensorParallel(input, *shards_.tp);
  at::Tensor q, k, v;
  if (l.qkv.defined()) {
    const at::Tensor qkv = linear_(x, l.qkv, l.qkvBias);
    q = qkv.narrow(2, 0, heads_ * d);
    k = qkv.narrow(2, heads_ * d, kvHeads_ * d);
    v = qkv.narrow(2, (heads_ + kvHeads_) * d, kvHeads_ * d);
  } else {
    q = linear_(x, l.q, l.qBias), k = linear_(x, l.k, l.kBias), v = linear_(x, l.v, l.vBias);
  }
  q = q.view({t, heads_, d});
  k = k.view({t, kvHeads_, d});
  v = v.view({t, kvHeads_, d});
  const QkNorms norms = config_.qkNorm ? QkNorms{.q = l.qNorm, .k = l.kNorm, .eps = config_.rmsNormEps} : QkNorms{};
  const int64_t layer = &l - layers_.data();
  const at::Tensor& keys = kvCache_->keys[layer];
  const at::Tensor& values = kvCache_->values[layer];
  q = ops().ropeKvWrite(q, k, v, norms, batchCos_, batchSin_, pagedStep_->slots, keys, values);
  const at::Tensor attended = ops().pagedAttention(q, keys, values, pagedStep_->sequences);
  return rowParallel(attended.reshape({1, t, heads_ * d}), l.o, l.oBias);
}

at::Tensor DecoderModel::pagedLogits(const at::Tensor& tokens, const PagedStep& step, PagedKvCache& cache) {
  at::NoGradGuard noGrad;
  auto [cos, sin] = rotary(cache.maxModelLen);
  batchCos_ = cos.index_select(0, step.positions);
  batchSin_ = sin.index_select(0, step.positions);
  attentionMask_ = at::Tensor();
  pagedStep_ = &step;
  kvCache_ = &cache;
  struct Reset {
    DecoderModel* model;
    ~Reset() { model->pagedStep_ = nullptr, model->kvCache_ = nullptr; }
  } reset{this};
  // The layers of block(), with each residual add done in one op with the norm after it: a
  // layer's MLP output is added to the stream by the next layer's input norm (the last layer's
  // by the final norm).
  const double eps = config_.rmsNormEps;
  at::Tensor residual = block(0, tokens.view({1, -1}));
  at::Tensor normed = ops().rmsNorm(residual, layers_.front().inputNorm, eps);
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto [h, out] = layerPastInputNorm(layers_[i], residual, normed, RoutingMode::kRoute, nullptr);
    const bool last = i + 1 == layers_.size();
    if (last) {  // only the rows that are sampled reach the head: a prompt's other tokens need no logits
      h = h.index_select(1, step.logitRows);
      out = out.index_select(1, step.logitRows);
    }
    std::tie(residual, normed) = ops().addRmsNorm(h, out, last ? finalNorm_ : layers_[i + 1].inputNorm, eps);
  }
  return headLogits(normed).squeeze(0);
}

}  // namespace loom::worker
