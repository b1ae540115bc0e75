#include "worker/torch/model/moe.h"

#include <limits>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "worker/torch/model/ops.h"
#include "worker/torch/parallel/expert_parallel.h"

namespace loom::worker {

namespace {

using Scoring = planner::RouterConfig::Scoring;

// deepseek_v3's choice: the experts of the topk_group best groups (a group scores as the sum of
// its best two experts' biased scores), the top k of those by biased score.
at::Tensor groupLimitedTopK(const planner::ModelConfig& config, const at::Tensor& choice) {
  const planner::RouterConfig& r = config.router;
  const int64_t n = choice.size(0), perGroup = config.numExperts / r.groups;
  const at::Tensor grouped = choice.view({n, r.groups, perGroup});
  const at::Tensor groupScores = std::get<0>(grouped.topk(2, -1)).sum(-1);  // [N, G]
  const at::Tensor kept = std::get<1>(groupScores.topk(r.groupsPerToken, -1, /*largest=*/true, /*sorted=*/false));
  const at::Tensor groupMask = at::zeros_like(groupScores).scatter_(1, kept, 1.0).to(at::kBool);
  const at::Tensor expertMask = groupMask.unsqueeze(-1).expand({n, r.groups, perGroup}).reshape({n, -1});
  const at::Tensor masked = choice.masked_fill(expertMask.logical_not(), -std::numeric_limits<float>::infinity());
  return std::get<1>(masked.topk(config.expertsPerToken, -1, /*largest=*/true, /*sorted=*/false));
}

// How many of `experts` (int64) name each of the `numExperts`. Not at::bincount: on a GPU it reads
// the largest id back to the host to size its output, a wait per layer.
at::Tensor countPerExpert(const at::Tensor& experts, int64_t numExperts) {
  return at::zeros({numExperts}, experts.options()).scatter_add_(0, experts, at::ones_like(experts));
}

}  // namespace

Routing routeTokens(const planner::ModelConfig& config, const at::Tensor& x, const MoeWeights& w,
                    const at::Tensor& chosen) {
  const planner::RouterConfig& r = config.router;
  Routing out;
  out.logits = at::linear(x.to(at::kFloat), w.router.to(at::kFloat));
  if (chosen.defined()) {
    // A replay: the weights of the recorded experts, as the first forward weighted them.
    const at::Tensor scores = r.scoring == Scoring::kSoftmax ? at::softmax(out.logits, -1) : out.logits.sigmoid();
    at::Tensor weights = scores.gather(1, chosen);
    if (r.normalizeTopK)
      weights = r.scoring == Scoring::kSoftmax ? weights / weights.sum(-1, /*keepdim=*/true)
                                               : weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
    out.experts = chosen;
    out.weights = r.scalingFactor != 1.0 ? weights * r.scalingFactor : weights;
    return out;
  }
  if (r.scoring == Scoring::kSoftmax && r.groups == 1) {
    auto [weights, experts] = at::softmax(out.logits, -1).topk(config.expertsPerToken, -1);
    out.weights = r.normalizeTopK ? weights / weights.sum(-1, /*keepdim=*/true) : weights;
    out.experts = experts;
  } else if (r.scoring == Scoring::kSoftmax) {
    // AutoEP's num_expert_groups over softmax scores: chosen as deepseek_v3 chooses, weighted by
    // the softmax.
    const at::Tensor probabilities = at::softmax(out.logits, -1);
    {
      at::NoGradGuard noGrad;
      out.experts = groupLimitedTopK(config, probabilities.detach());
    }
    const at::Tensor weights = probabilities.gather(1, out.experts);
    out.weights = r.normalizeTopK ? weights / weights.sum(-1, /*keepdim=*/true) : weights;
  } else {
    const at::Tensor scores = out.logits.sigmoid();
    at::Tensor choice = scores;
    if (w.scoreCorrection.defined()) choice = scores + w.scoreCorrection.to(at::kFloat);
    {
      at::NoGradGuard noGrad;  // which experts, not how much: no gradient flows through the choice
      out.experts = r.groups > 1 ? groupLimitedTopK(config, choice.detach())
                                 : std::get<1>(choice.detach().topk(config.expertsPerToken, -1, true, false));
    }
    at::Tensor weights = scores.gather(1, out.experts);
    if (r.normalizeTopK) weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
    out.weights = weights;
  }
  if (r.scalingFactor != 1.0) out.weights = out.weights * r.scalingFactor;
  return out;
}

at::Tensor expertActivation(const planner::ExpertMlpConfig& mlp, const at::Tensor& gate, const at::Tensor& up) {
  using Activation = planner::ExpertMlpConfig::Activation;
  switch (mlp.activation) {
    case Activation::kSwiglu: return ops().swiglu(gate, up);
    case Activation::kGegluTanh: return at::gelu(gate, "tanh") * up;
    case Activation::kSwigluClamped: return at::silu(gate.clamp_max(mlp.limit)) * up.clamp(-mlp.limit, mlp.limit);
    case Activation::kSwigluOai: return ops().clampedSwiglu(gate, up, mlp.alpha, mlp.limit);
  }
  return ops().swiglu(gate, up);
}

namespace {

// The activation over gate and up side by side in one [R, 2I] (gate_up_impl "fused").
at::Tensor packedActivation(const planner::ExpertMlpConfig& mlp, const at::Tensor& gateUp) {
  const int64_t width = gateUp.size(-1) / 2;
  return expertActivation(mlp, gateUp.narrow(-1, 0, width), gateUp.narrow(-1, width, width));
}

// On a GPU, libtorch's grouped GEMM (at::_grouped_mm, cuBLAS/CUTLASS grouped kernels) runs every
// expert's rows in one launch per projection: the experts' weights stacked [E, out, in] (a copy,
// through which their gradients flow back), rows grouped by the cumulative counts; fused, gate
// and up stacked as one [E, 2I, H]. `counts` [E] stays on the device: the group ends are its
// running sum, and the host never waits for the router (a wait per layer would leave the GPU
// idle while the host queues the rest).
at::Tensor groupedMmExperts(const at::Tensor& rows, const at::Tensor& counts, const MoeWeights& w,
                            const planner::ExpertMlpConfig& mlp) {
  const at::Tensor offsets = counts.to(rows.device(), /*non_blocking=*/true).cumsum(0).to(at::kInt);
  auto grouped = [&](const at::Tensor& x, const at::Tensor& stacked) {
    return at::_grouped_mm(x, stacked.transpose(1, 2), offsets);
  };
  at::Tensor hidden;
  if (mlp.fusedGateUp) {
    hidden = packedActivation(mlp, grouped(rows, at::cat({at::stack(w.gate), at::stack(w.up)}, 1)));
  } else {
    hidden = expertActivation(mlp, grouped(rows, at::stack(w.gate)), grouped(rows, at::stack(w.up)));
  }
  return grouped(hidden, at::stack(w.down));
}

}  // namespace

at::Tensor groupedExpertMlp(const at::Tensor& rows, const std::vector<int64_t>& counts, const MoeWeights& w,
                            LinearFn linear, const planner::ExpertMlpConfig& mlp) {
  if (rows.is_cuda() && rows.scalar_type() == at::kBFloat16) return groupedMmExperts(rows, at::tensor(counts), w, mlp);
  std::vector<at::Tensor> outputs;
  outputs.reserve(w.gate.size());
  int64_t offset = 0;
  for (size_t e = 0; e < w.gate.size(); ++e) {
    const at::Tensor group = rows.narrow(0, offset, counts[e]);
    const at::Tensor hidden =
        mlp.fusedGateUp ? packedActivation(mlp, linear(group, at::cat({w.gate[e], w.up[e]}, 0), {}))
                        : expertActivation(mlp, linear(group, w.gate[e], {}), linear(group, w.up[e], {}));
    outputs.push_back(linear(hidden, w.down[e], {}));
    offset += counts[e];
  }
  return at::cat(outputs, 0);
}

at::Tensor moeForward(const planner::ModelConfig& config, const at::Tensor& x, const MoeWeights& w, LinearFn linear,
                      ExpertParallel* ep, Routing* routing, RoutingMode mode, RoutingRecord* record) {
  const bool replay = mode == RoutingMode::kReplay;
  *routing = routeTokens(config, x, w, replay ? record->experts : at::Tensor());
  if (mode != RoutingMode::kRoute) record->routerLogits = routing->logits;
  if (mode == RoutingMode::kRecord) record->experts = routing->experts;
  const int64_t topK = config.expertsPerToken;
  // Each (token, choice) pair becomes a row, the rows grouped by expert (a stable sort keeps each
  // group in token order).
  const at::Tensor flatExperts = routing->experts.reshape({-1});
  const at::Tensor order = std::get<1>(at::sort(flatExperts, /*stable=*/std::optional<bool>(true), /*dim=*/0));
  const at::Tensor tokenOfRow = order.div(topK, "floor");
  routing->tokensPerExpert = countPerExpert(flatExperts, config.numExperts);
  const at::Tensor rows = x.index_select(0, tokenOfRow);
  at::Tensor expertOut;
  if (!ep && rows.is_cuda() && rows.scalar_type() == at::kBFloat16) {
    expertOut = groupedMmExperts(rows, routing->tokensPerExpert, w, config.expertMlp);
  } else {
    // The groups' sizes on the host: the exchange's splits (and the per-expert GEMMs) need them.
    std::vector<int64_t> perExpert;
    if (replay) {
      perExpert = record->counts;
    } else {
      const at::Tensor counts = routing->tokensPerExpert.cpu();
      perExpert.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
      if (mode == RoutingMode::kRecord) record->counts = perExpert;
    }
    std::vector<int64_t>* arrived = mode == RoutingMode::kRoute ? nullptr : &record->arrived;
    expertOut = ep ? ep->run(rows, perExpert, w, linear, config.expertMlp, arrived)
                   : groupedExpertMlp(rows, perExpert, w, linear, config.expertMlp);
  }
  const at::Tensor rowWeights = routing->weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  const at::Tensor weighted = (expertOut.to(at::kFloat) * rowWeights).to(x.scalar_type());
  at::Tensor out = at::zeros_like(x).index_add(0, tokenOfRow, weighted);
  if (w.sharedGate.defined()) {
    at::Tensor shared = linear(ops().swiglu(linear(x, w.sharedGate, {}), linear(x, w.sharedUp, {})), w.sharedDown, {});
    if (w.sharedExpertGate.defined()) shared = at::sigmoid(linear(x, w.sharedExpertGate, {})) * shared;
    out = out + shared;
  }
  return out;
}

void LoadBalancingLoss::add(const at::Tensor& routerLogits, int64_t topK) {
  const at::Tensor probabilities = at::softmax(routerLogits.to(at::kFloat), -1);
  at::Tensor chosen;
  {
    at::NoGradGuard noGrad;
    chosen = countPerExpert(std::get<1>(probabilities.topk(topK, -1)).reshape({-1}), routerLogits.size(1))
                 .to(at::kFloat);
  }
  const at::Tensor summed = probabilities.sum(0);
  assignments_ = assignments_.defined() ? assignments_ + chosen : chosen;
  probabilities_ = probabilities_.defined() ? probabilities_ + summed : summed;
  rows_ += routerLogits.size(0);
}

at::Tensor LoadBalancingLoss::value(int64_t numExperts) const {
  if (!assignments_.defined()) return {};
  const double rows = static_cast<double>(rows_);
  return ((assignments_ / rows) * (probabilities_ / rows)).sum() * static_cast<double>(numExperts);
}

void LoadBalancingLoss::clear() {
  assignments_ = at::Tensor();
  probabilities_ = at::Tensor();
  rows_ = 0;
}

}  // namespace loom::worker
