#include "worker/torch/model/decoder_model.h"

#include <cmath>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "backends/self_communicator.h"
#include "planner/model_parameters.h"
#include "worker/torch/model/ops.h"
#include "worker/torch/parallel/sequence_parallel.h"
#include "worker/torch/parallel/tensor_parallel.h"
#include "worker/torch/parallel/vocab_parallel.h"

namespace loom::worker {

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

namespace {

at::Tensor plainLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return at::linear(x, weight, bias);
}

}  // namespace

DecoderModel::DecoderModel(const planner::ModelConfig& config, at::ScalarType dtype, at::Device device,
                           ModelShards shards)
    : config_(config), dtype_(dtype), device_(device), shards_(std::move(shards)), linear_(plainLinear) {}

StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::create(const planner::ModelConfig& config,
                                                             at::ScalarType dtype, at::Device device,
                                                             ModelShards shards) {
  if (!shards.tp) shards.tp = std::make_shared<backends::SelfCommunicator>("tensor");
  if (!shards.sp) shards.sp = std::make_shared<backends::SelfCommunicator>("sequence");
  if (!shards.ep) shards.ep = std::make_shared<backends::SelfCommunicator>("expert");
  // This rank's parameters: every dense one and, under expert parallelism, its own experts.
  const int ep = shards.ep->size();
  if (ep > 1 && (!config.isMoe() || config.numExperts % ep != 0))
    return invalidArgument("model: expert parallel {} needs a mixture-of-experts model whose experts it divides ({} "
                           "has {})",
                           ep, planner::modelFamilyName(config.family), config.numExperts);
  const int64_t perRank = config.isMoe() ? config.numExperts / ep : 0;
  std::vector<planner::ParameterInfo> enumerated;
  for (auto& p : planner::enumerateParameters(config))
    if (p.expert < 0 || p.expert / perRank == shards.ep->rank()) enumerated.push_back(std::move(p));
  if (shards.layouts.empty()) {
    for (const auto& p : enumerated) shards.layouts.push_back(ShardLayout{.whole = p.shape, .local = p.shape});
  }
  if (shards.layouts.size() != enumerated.size())
    return internalError("model: {} shard layouts for {} parameters", shards.layouts.size(), enumerated.size());
  std::unique_ptr<DecoderModel> model(new DecoderModel(config, dtype, device, std::move(shards)));
  for (size_t i = 0; i < enumerated.size(); ++i) {
    at::Tensor t = at::empty(model->layoutOf(static_cast<int>(i)).local, at::TensorOptions().dtype(dtype).device(device));
    t.set_requires_grad(enumerated[i].trainable);  // buffers (the score-correction bias) get no gradient
    model->parameters_.emplace_back(enumerated[i].name, std::move(t));
  }
  if (ep > 1) model->expertParallel_ = std::make_unique<ExpertParallel>(model->shards_.ep, config.numExperts);
  model->bindLayers();
  model->inverseFrequencies_ = ropeInverseFrequencies(config);
  return model;
}

at::Tensor DecoderModel::parameter(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? at::Tensor() : parameters_[it->second].second;
}

void DecoderModel::bindExperts(Layer& l, const std::string& p) {
  const bool mixtral = config_.family == planner::ModelFamily::kMixtral;
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  MoeWeights& w = l.experts;
  l.moe = true;
  w.router = parameter(moe + "gate.weight");
  w.scoreCorrection = parameter(moe + "gate.e_score_correction_bias");
  // The experts this rank holds (all of them without expert parallelism), in order.
  for (int64_t e = 0; e < config_.numExperts; ++e) {
    const std::string ex = fmt::format("{}experts.{}.", moe, e);
    at::Tensor gate = parameter(ex + (mixtral ? "w1.weight" : "gate_proj.weight"));
    if (!gate.defined()) continue;
    w.gate.push_back(gate);
    w.up.push_back(parameter(ex + (mixtral ? "w3.weight" : "up_proj.weight")));
    w.down.push_back(parameter(ex + (mixtral ? "w2.weight" : "down_proj.weight")));
  }
  const std::string shared = moe + (config_.family == planner::ModelFamily::kDeepseekV3 ? "shared_experts." : "shared_expert.");
  w.sharedGate = parameter(shared + "gate_proj.weight");
  w.sharedUp = parameter(shared + "up_proj.weight");
  w.sharedDown = parameter(shared + "down_proj.weight");
  w.sharedExpertGate = parameter(moe + "shared_expert_gate.weight");
  // Whole on every tensor-parallel rank, but each rank's gradient covers its experts' columns only.
  sumGradientOverGroup(w.router, *shards_.tp);
  sumGradientOverGroup(w.sharedExpertGate, *shards_.tp);
}

void DecoderModel::bindLayers() {
  index_.clear();
  for (size_t i = 0; i < parameters_.size(); ++i) index_[parameters_[i].first] = static_cast<int>(i);
  auto indexOf = [&](const std::string& name) {
    auto it = index_.find(name);
    return it == index_.end() ? -1 : it->second;
  };
  blockParameters_.assign(numBlocks(), {});
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const std::string& name = parameters_[i].first;
    if (name.rfind("model.layers.", 0) == 0) {
      const int layer = std::stoi(name.substr(13));
      blockParameters_[layer + 1].push_back(static_cast<int>(i));
    }
  }
  blockParameters_.front() = {indexOf("model.embed_tokens.weight")};
  blockParameters_.back() = {indexOf("model.norm.weight"),
                             indexOf(config_.tieWordEmbeddings ? "model.embed_tokens.weight" : "lm_head.weight")};
  embed_ = parameter("model.embed_tokens.weight");
  finalNorm_ = parameter("model.norm.weight");
  head_ = config_.tieWordEmbeddings ? embed_ : parameter("lm_head.weight");
  const int tp = shards_.tp->size();
  heads_ = config_.numHeads / tp;
  vocabStart_ = embed_.size(0) * (layoutOf(indexOf("model.embed_tokens.weight")).sharded() ? shards_.tp->rank() : 0);
  layers_.clear();
  for (int64_t i = 0; i < config_.numLayers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    layers_.push_back(Layer{
        .inputNorm = parameter(p + "input_layernorm.weight"),
        .q = parameter(p + "self_attn.q_proj.weight"),
        .k = parameter(p + "self_attn.k_proj.weight"),
        .v = parameter(p + "self_attn.v_proj.weight"),
        .o = parameter(p + "self_attn.o_proj.weight"),
        .qBias = parameter(p + "self_attn.q_proj.bias"),
        .kBias = parameter(p + "self_attn.k_proj.bias"),
        .vBias = parameter(p + "self_attn.v_proj.bias"),
        .oBias = parameter(p + "self_attn.o_proj.bias"),
        .qNorm = parameter(p + "self_attn.q_norm.weight"),
        .kNorm = parameter(p + "self_attn.k_norm.weight"),
        .postNorm = parameter(p + "post_attention_layernorm.weight"),
        .gate = parameter(p + "mlp.gate_proj.weight"),
        .up = parameter(p + "mlp.up_proj.weight"),
        .down = parameter(p + "mlp.down_proj.weight"),
        .gateBias = parameter(p + "mlp.gate_proj.bias"),
        .upBias = parameter(p + "mlp.up_proj.bias"),
        .downBias = parameter(p + "mlp.down_proj.bias"),
        .kvLayout = config_.isMla() ? ShardLayout{} : layoutOf(indexOf(p + "self_attn.k_proj.weight")),
        .latent = {},
        .moe = false,
        .experts = {},
        .index = i,
    });
    Layer& l = layers_.back();
    if (config_.isMla()) {
      const std::string a = p + "self_attn.";
      l.latent = LatentAttentionWeights{.q = parameter(a + "q_proj.weight"),
                                        .qA = parameter(a + "q_a_proj.weight"),
                                        .qABias = parameter(a + "q_a_proj.bias"),
                                        .qANorm = parameter(a + "q_a_layernorm.weight"),
                                        .qB = parameter(a + "q_b_proj.weight"),
                                        .kvA = parameter(a + "kv_a_proj_with_mqa.weight"),
                                        .kvABias = parameter(a + "kv_a_proj_with_mqa.bias"),
                                        .kvANorm = parameter(a + "kv_a_layernorm.weight"),
                                        .kvB = parameter(a + "kv_b_proj.weight")};
      // The latents are whole on every tensor-parallel rank, but each rank's gradient covers its
      // heads only.
      for (at::Tensor* t : {&l.latent.qA, &l.latent.qABias, &l.latent.qANorm, &l.latent.kvA, &l.latent.kvABias,
                            &l.latent.kvANorm})
        sumGradientOverGroup(*t, *shards_.tp);
    }
    if (config_.isMoeLayer(i)) bindExperts(l, p);
  }
  if (config_.isMla()) {
    kvHeads_ = heads_;
    return;  // latent attention's projections down to the latents are whole; its up projections split by heads
  }
  kvHeads_ = layers_.empty() ? config_.numKvHeads : layers_.front().k.size(0) / config_.headDim;
  // Gradients each rank computes only in part: q/k norms (applied to this rank's heads) and KV
  // heads shared by several ranks.
  for (Layer& l : layers_) {
    sumGradientOverGroup(l.qNorm, *shards_.tp);
    sumGradientOverGroup(l.kNorm, *shards_.tp);
    for (at::Tensor* kv : {&l.k, &l.v, &l.kBias, &l.vBias}) sumGradientOverKvReplicas(*kv, l.kvLayout, *shards_.tp);
  }
}

void DecoderModel::initRandom(int64_t seed) {
  at::NoGradGuard noGrad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  // Every tensor of the model in order, the other ranks' experts too (drawn and dropped), so that
  // each rank draws the same sequence whatever it holds.
  for (const planner::ParameterInfo& p : planner::enumerateParameters(config_)) {
    const std::string& name = p.name;
    auto held = index_.find(name);
    at::Tensor t = held == index_.end() ? at::Tensor() : parameters_[held->second].second;
    if (endsWith(name, "norm.weight")) {
      if (t.defined()) t.fill_(1.0);
    } else if (endsWith(name, ".bias") || endsWith(name, "e_score_correction_bias")) {
      if (t.defined()) t.zero_();
    } else {
      // Drawn whole in fp32 (every rank draws the same sequence) and cast, so a bf16 model starts
      // from the rounded fp32 weights; this rank keeps its piece.
      at::Tensor w = at::empty(p.shape, at::kFloat);
      w.normal_(0.0, config_.initializerRange, generator);
      if (t.defined()) t.copy_(takeShard(w, layoutOf(held->second)));
    }
  }
}

Status DecoderModel::loadWeights(const TensorMap& weights, const std::string& source) {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const std::string& name = parameters_[i].first;
    const ShardLayout& layout = layoutOf(static_cast<int>(i));
    auto it = weights.find(name);
    if (it == weights.end()) return invalidArgument("{}: tensor {} is missing", source, name);
    if (it->second.sizes() != at::IntArrayRef(layout.whole))
      return invalidArgument("{}: tensor {} has shape {}, the model's config wants {}", source, name,
                             c10::str(it->second.sizes()), c10::str(at::IntArrayRef(layout.whole)));
  }
  std::unordered_set<std::string> otherRanksExperts;  // under expert parallelism, in the file but not here
  if (shards_.ep->size() > 1) {
    for (const auto& p : planner::enumerateParameters(config_))
      if (p.expert >= 0 && !parameter(p.name).defined()) otherRanksExperts.insert(p.name);
  }
  for (const auto& [name, tensor] : weights) {
    if (name == "lm_head.weight" && config_.tieWordEmbeddings) continue;
    if (parameter(name).defined() || otherRanksExperts.count(name)) continue;
    // Rotary caches some exporters store are derived, not learned.
    if (endsWith(name, "rotary_emb.inv_freq")) continue;
    return invalidArgument("{}: tensor {} is not a parameter of this {} model", source, name,
                           planner::modelFamilyName(config_.family));
  }
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& [name, t] = parameters_[i];
    t.copy_(takeShard(weights.at(name), layoutOf(static_cast<int>(i))));
  }
  return Status::ok();
}

std::pair<at::Tensor, at::Tensor> DecoderModel::rotary(int64_t seqLen) {
  if (seqLen != rotarySeqLen_) {
    at::Tensor positions = at::arange(seqLen, at::kLong).to(at::kFloat);
    at::Tensor freqs = at::outer(positions, inverseFrequencies_);  // [S, D/2]
    at::Tensor angles = at::cat({freqs, freqs}, -1);
    const double factor = ropeAttentionFactor(config_);  // yarn scales the tables themselves
    cos_ = (angles.cos() * factor).to(device_, dtype_);
    sin_ = (angles.sin() * factor).to(device_, dtype_);
    rotarySeqLen_ = seqLen;
  }
  return {cos_, sin_};
}

void DecoderModel::prepareBatch(const at::Tensor& tokens, const TokenLayout& layout) {
  backends::Communicator& sp = *shards_.sp;
  const int64_t share = tokens.size(1), whole = share * sp.size();
  auto [cos, sin] = rotary(whole);
  if (layout.packed()) {
    const at::Tensor positions = layout.positions.reshape({-1});
    batchCos_ = cos.index_select(0, positions).view({tokens.size(0), share, cos.size(1)});
    batchSin_ = sin.index_select(0, positions).view({tokens.size(0), share, sin.size(1)});
  } else {
    // A rank's share of the sequence sits at its place in the group.
    batchCos_ = cos.narrow(0, sp.rank() * share, share);
    batchSin_ = sin.narrow(0, sp.rank() * share, share);
  }
  const int64_t window = config_.slidingWindow;
  const bool windowed = window > 0 && window < whole;
  if (!layout.packed() && !windowed) {
    attentionMask_ = at::Tensor();
    return;
  }
  // Query i sees key j <= i (and with a window, i - window < j), of its own document.
  const auto options = at::TensorOptions().dtype(at::kLong).device(device_);
  const at::Tensor i = at::arange(whole, options).unsqueeze(1), j = at::arange(whole, options).unsqueeze(0);
  at::Tensor allowed = j <= i;
  if (windowed) allowed = allowed.logical_and(i - j < window);
  if (layout.packed()) {
    const at::Tensor& documents = layout.documents;
    allowed = allowed.unsqueeze(0).logical_and(documents.unsqueeze(2) == documents.unsqueeze(1)).unsqueeze(1);
  }
  attentionMask_ = allowed;
}

at::Tensor DecoderModel::rowParallel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  backends::Communicator& tp = *shards_.tp;
  if (tp.size() == 1) return linear_(x, weight, bias);
  // The group's partial sums added up, then the bias, whole, once.
  at::Tensor out = reduceFromTensorParallel(linear_(x, weight, {}), tp);
  return bias.defined() ? out + bias : out;
}

void DecoderModel::setFlopsProfile(FlopsProfile* profile) {
  if (profile && !profile_) {
    unprofiledLinear_ = linear_;
    linear_ = &FlopsProfile::profiledLinear;
  } else if (!profile && profile_) {
    linear_ = unprofiledLinear_;
  }
  profile_ = profile;
  FlopsProfile::install(profile, unprofiledLinear_);
}

at::Tensor DecoderModel::attendWhole(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t b = q.size(0), s = q.size(1), heads = q.size(2), d = q.size(3);
  if (profile_) profile_->countAttention(b, heads, s, k.size(1), d, v.size(3));  // F.scaled_dot_product_attention
  at::Tensor out = ops().attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attentionMask_);
  return out.transpose(1, 2).reshape({b, s, heads * d});
}

at::Tensor DecoderModel::attentionBlock(const Layer& l, const at::Tensor& input) {
  if (pagedStep_) return pagedAttentionBlock(l, input);
  backends::Communicator& tp = *shards_.tp;
  backends::Communicator& sp = *shards_.sp;
  const int64_t b = input.size(0), s = input.size(1), d = config_.headDim;
  const at::Tensor x = copyToTensorParallel(input, tp);
  auto heads = [&](const at::Tensor& w, const at::Tensor& bias, int64_t n) {
    return linear_(x, w, bias).view({b, s, n, d});
  };
  at::Tensor q = heads(l.q, l.qBias, heads_);
  at::Tensor k = heads(l.k, l.kBias, kvHeads_);
  at::Tensor v = heads(l.v, l.vBias, kvHeads_);
  if (config_.qkNorm) {
    {
      FlopsProfile::Scope scope(profile_, l.index, "self_attn.q_norm");
      q = ops().rmsNorm(q, l.qNorm, config_.rmsNormEps);
    }
    FlopsProfile::Scope scope(profile_, l.index, "self_attn.k_norm");
    k = ops().rmsNorm(k, l.kNorm, config_.rmsNormEps);
  }
  auto [qr, kr] = ops().rope(q.transpose(1, 2), k.transpose(1, 2), batchCos_, batchSin_);
  q = qr.transpose(1, 2);
  k = kr.transpose(1, 2);
  if (sp.size() == 1) return rowParallel(attendWhole(q, k, v), l.o, l.oBias);
  // One exchange carries q, k and v: each rank's head group of the three, side by side.
  const int n = sp.size();
  k = kvHeadsForSequenceParallel(k, n);
  v = kvHeadsForSequenceParallel(v, n);
  const int64_t hq = heads_ / n, hk = k.size(2) / n;
  const at::Tensor grouped = at::cat({q.reshape({b, s, n, hq, d}), k.reshape({b, s, n, hk, d}),
                                      v.reshape({b, s, n, hk, d})},
                                     3);
  const at::Tensor whole = gatherSequence(grouped, sp);  // [B, S, hq + 2 hk, D]
  const at::Tensor attended =
      attendWhole(whole.narrow(2, 0, hq), whole.narrow(2, hq, hk), whole.narrow(2, hq + hk, hk));
  const at::Tensor mine = scatterSequence(attended.view({b, s * n, hq, d}), sp);  // [B, s, sp, hq, D]
  return rowParallel(mine.reshape({b, s, heads_ * d}), l.o, l.oBias);
}

at::Tensor DecoderModel::moeBlock(const Layer& l, const at::Tensor& input, RoutingMode mode, RoutingRecord* record) {
  backends::Communicator& tp = *shards_.tp;
  const at::Tensor x = copyToTensorParallel(input, tp);
  const at::Tensor rows = x.reshape({-1, x.size(-1)});
  Routing routing;
  at::Tensor out;
  {
    // The experts' linear layers count into `experts` (the fused module transformers 5 has), the
    // shared expert's into its own; the router's F.linear (and softmax) into `gate`.
    FlopsProfile::Scope scope(profile_, l.index, "mlp.experts");
    out = moeForward(config_, rows, l.experts, linear_, expertParallel_.get(), &routing, mode, record);
  }
  if (profile_) {
    const std::string gate = fmt::format("model.layers.{}.mlp.gate", l.index);
    profile_->countMacs(rows.size(0) * rows.size(1) * config_.numExperts, gate);
    if (config_.family != planner::ModelFamily::kDeepseekV3) profile_->countElementwise(rows.size(0) * config_.numExperts, gate);
    profile_->countElementwise(rows.size(0) * config_.expertsPerToken * config_.expertIntermediateSize,
                               fmt::format("model.layers.{}.mlp.experts.act_fn", l.index));
  }
  // A checkpointed layer hands its router logits out of the checkpoint (block()); a replay
  // counts nothing twice.
  if (mode == RoutingMode::kRoute && config_.outputRouterLogits && at::GradMode::is_enabled())
    loadBalancing_.add(routing.logits, config_.expertsPerToken);
  if (mode != RoutingMode::kReplay)
    expertLoad_ = expertLoad_.defined() ? expertLoad_ + routing.tokensPerExpert : routing.tokensPerExpert;
  // Under tensor parallelism each rank computed its columns of every expert: the sums add up.
  if (tp.size() > 1) out = reduceFromTensorParallel(out, tp);
  return out.view(input.sizes());
}

std::vector<int64_t> DecoderModel::takeExpertLoad() {
  if (!expertLoad_.defined()) return {};
  const at::Tensor load = std::exchange(expertLoad_, at::Tensor()).cpu();
  return std::vector<int64_t>(load.data_ptr<int64_t>(), load.data_ptr<int64_t>() + load.numel());
}

at::Tensor DecoderModel::mlpBlock(const Layer& l, const at::Tensor& input) {
  backends::Communicator& tp = *shards_.tp;
  const at::Tensor x = copyToTensorParallel(input, tp);
  // Fused (fuseProjections) where the GEMMs are bound by reading their weights: steps of a few
  // hundred rows. At a prefill's thousands they are bound by arithmetic.
  constexpr int64_t kFusedRowsMax = 512;
  const int64_t rows = x.numel() / x.size(-1);
  if (l.gateUp.defined() && rows <= kFusedRowsMax) {
    // The fused product transposed, [2I, T]: its gate and up halves are then contiguous blocks
    // of rows, which SwiGLU reads in place (the halves of [T, 2I] would each need a copy), and
    // the down projection reads SwiGLU's [I, T] through the GEMM's transpose flag.
    at::Tensor both = at::mm(l.gateUp, x.reshape({rows, x.size(-1)}).t());
    if (l.gateUpBias.defined()) both = both + l.gateUpBias.unsqueeze(1);
    const int64_t n = l.gate.size(0);
    const at::Tensor hidden = ops().swiglu(both.narrow(0, 0, n), both.narrow(0, n, n)).t();  // [T, I]
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = l.down.size(0);
    return rowParallel(hidden, l.down, l.downBias).view(sizes);
  }
  const at::Tensor gate = linear_(x, l.gate, l.gateBias), up = linear_(x, l.up, l.upBias);
  at::Tensor hidden;
  {
    FlopsProfile::Scope scope(profile_, l.index, "mlp.act_fn");
    if (profile_) profile_->countElementwise(gate.numel());  // F.silu
    hidden = ops().swiglu(gate, up);
  }
  return rowParallel(hidden, l.down, l.downBias);
}

at::Tensor DecoderModel::block(int index, const at::Tensor& input) {
  backends::Communicator& tp = *shards_.tp;
  if (index == 0) {
    FlopsProfile::Scope scope(profile_, "model.embed_tokens");
    return vocabParallelEmbedding(embed_, input, vocabStart_, tp);
  }
  if (index == numBlocks() - 1) {
    at::Tensor normed;
    {
      FlopsProfile::Scope scope(profile_, "model.norm");
      normed = ops().rmsNorm(input, finalNorm_, config_.rmsNormEps);
    }
    if (profile_) profile_->close("model");
    return headLogits(normed);
  }
  if (!at::GradMode::is_enabled() || !checkpointing_.covers(index - 1) || !needsGradient(index, input))
    return decoderLayer(index, input);
  CheckpointedOutput out = checkpointedLayer(*this, index, input, checkpointing_);
  if (out.routerLogits.defined() && config_.outputRouterLogits)
    loadBalancing_.add(out.routerLogits, config_.expertsPerToken);
  return out.hidden;
}

at::Tensor DecoderModel::headLogits(const at::Tensor& normed) {
  FlopsProfile::Scope scope(profile_, "lm_head");
  return linear_(copyToTensorParallel(normed, *shards_.tp), head_, {});
}

bool DecoderModel::needsGradient(int index, const at::Tensor& input) const {
  if (input.requires_grad()) return true;
  for (int i : blockParameters_[index])
    if (parameters_[i].second.requires_grad()) return true;
  return false;  // a frozen layer under a frozen embedding: nothing to recompute for
}

at::Tensor DecoderModel::decoderLayer(int index, const at::Tensor& input, RoutingMode mode, RoutingRecord* record) {
  const Layer& layer = layers_[index - 1];
  FlopsProfile::Scope whole(profile_, layer.index, "");
  at::Tensor normed;
  {
    FlopsProfile::Scope scope(profile_, layer.index, "input_layernorm");
    normed = ops().rmsNorm(input, layer.inputNorm, config_.rmsNormEps);
  }
  auto [h, out] = layerPastInputNorm(layer, input, normed, mode, record);
  return h + out;
}

std::pair<at::Tensor, at::Tensor> DecoderModel::layerPastInputNorm(const Layer& layer, const at::Tensor& input,
                                                                   const at::Tensor& normed, RoutingMode mode,
                                                                   RoutingRecord* record) {
  at::Tensor attended, h, mlpInput, out;
  {
    FlopsProfile::Scope scope(profile_, layer.index, "self_attn");
    attended = config_.isMla() ? latentAttentionBlock(layer, normed) : attentionBlock(layer, normed);
  }
  {
    FlopsProfile::Scope scope(profile_, layer.index, "post_attention_layernorm");
    std::tie(h, mlpInput) = ops().addRmsNorm(input, attended, layer.postNorm, config_.rmsNormEps);
  }
  {
    FlopsProfile::Scope scope(profile_, layer.index, "mlp");
    out = layer.moe ? moeBlock(layer, mlpInput, mode, record) : mlpBlock(layer, mlpInput);
  }
  return {h, out};
}

at::Tensor DecoderModel::latentAttentionBlock(const Layer& l, const at::Tensor& input) {
  const at::Tensor x = copyToTensorParallel(input, *shards_.tp);
  const at::Tensor attended =
      latentAttention(config_, l.latent, x, heads_, batchCos_, batchSin_, attentionMask_, linear_);
  if (profile_) {  // F.scaled_dot_product_attention over the latent's heads
    const auto& m = config_.mla;
    profile_->countAttention(x.size(0), heads_, x.size(1), x.size(1), m.qkHeadDim(), m.vHeadDim);
  }
  return rowParallel(attended, l.o, l.oBias);
}

at::Tensor DecoderModel::logits(const at::Tensor& tokens, const TokenLayout& layout) {
  loadBalancing_.clear();
  FlopsProfile::Scope root(profile_, "");
  if (profile_) profile_->open("model");
  {
    FlopsProfile::Scope scope(profile_, "model.rotary_emb");
    prepareBatch(tokens, layout);
    // HF's rotary embedding: inv_freq [1, rotary/2, 1] @ positions [1, 1, S].
    const int64_t rotary = config_.isMla() ? config_.mla.qkRopeHeadDim : config_.headDim;
    if (profile_) profile_->countMacs(rotary / 2 * tokens.size(1) * shards_.sp->size());
  }
  at::Tensor h = tokens;
  for (int i = 0; i < numBlocks(); ++i) h = runner_ ? runner_->run(*this, i, h) : block(i, h);
  return h;
}

at::Tensor DecoderModel::loss(const at::Tensor& inputs, const at::Tensor& labels, const TokenLayout& layout) {
  FlopsProfile::Scope root(profile_, "");
  at::Tensor out = logits(inputs, layout);
  at::Tensor loss = crossEntropy(out.view({-1, out.size(-1)}), labels.reshape({-1}));
  const at::Tensor aux = takeRouterAuxLoss();
  return aux.defined() ? loss + aux.to(loss.scalar_type()) : loss;
}

at::Tensor DecoderModel::takeRouterAuxLoss() {
  auxLoss_ = loadBalancing_.value(config_.numExperts);
  loadBalancing_.clear();
  if (!auxLoss_.defined()) return {};
  // Every tensor-parallel rank computes the same load-balancing loss from the same whole router,
  // whose gradients are then summed over the group: each rank contributes its 1/tp share.
  const double tp = shards_.tp->size();
  const at::Tensor aux = tp == 1 ? auxLoss_ : auxLoss_.detach() + (auxLoss_ - auxLoss_.detach()) / tp;
  return config_.routerAuxLossCoef * aux;
}

namespace {

// A kernel plugin took the losses over (plugin_ops.h): on one rank it runs them, fused.
bool pluginLosses(const backends::Communicator& tp) {
  return tp.size() == 1 && ops().crossEntropy != referenceOps().crossEntropy;
}

}  // namespace

at::Tensor DecoderModel::crossEntropy(const at::Tensor& logits, const at::Tensor& labels) {
  if (pluginLosses(*shards_.tp)) return ops().crossEntropy(logits, labels);
  return vocabParallelCrossEntropy(logits, labels, vocabShard());
}

at::Tensor DecoderModel::tokenLogprobs(const at::Tensor& logits, const at::Tensor& labels) {
  if (pluginLosses(*shards_.tp)) {
    // The op table's logprobs knows no ignored label: those rows ask for token 0 and are then
    // zeroed, which also zeroes their gradient.
    const at::Tensor ignored = labels == -100;
    return ops().logprobs(logits, labels.masked_fill(ignored, 0)).masked_fill(ignored, 0.0);
  }
  return vocabParallelLogprobs(logits, labels, vocabShard());
}

at::Tensor DecoderModel::tokenEntropy(const at::Tensor& logits) {
  return vocabParallelEntropy(logits, vocabShard());
}

at::Tensor DecoderModel::tokenKl(const at::Tensor& logits, const at::Tensor& teacherLogits) {
  return vocabParallelKl(logits, teacherLogits, /*reverse=*/false, vocabShard());
}

}  // namespace loom::worker
