#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "planner/model_config.h"

namespace loom::worker {

class ExpertParallel;

// One decoder layer's mixture of experts, as HF's MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock,
// Qwen3MoeSparseMoeBlock and DeepseekV3MoE compute it: a router picks each token's top-k experts
// and their weights, the chosen experts' SwiGLU MLPs run over the tokens sent to them, and their
// outputs are summed back per token with the weights; shared experts (qwen2_moe, behind their
// own sigmoid gate; deepseek_v3) see every token.
struct MoeWeights {
  at::Tensor router;           // gate.weight [E, H]
  at::Tensor scoreCorrection;  // deepseek_v3's gate.e_score_correction_bias [E]; undefined elsewhere
  // This rank's experts in order (all of them, or under expert parallelism its own), each
  // [I, H] (gate, up) and [H, I] (down).
  std::vector<at::Tensor> gate, up, down;
  at::Tensor sharedGate, sharedUp, sharedDown;  // the shared experts' MLP; undefined: none
  at::Tensor sharedExpertGate;                  // qwen2_moe's shared_expert_gate.weight [1, H]
};

// What the router decided for N tokens.
struct Routing {
  at::Tensor logits;   // [N, E] fp32: the router's scores before softmax or sigmoid
  at::Tensor weights;  // [N, k] fp32: each chosen expert's weight in the token's sum
  at::Tensor experts;  // [N, k] int64: the chosen experts
  at::Tensor tokensPerExpert;  // [E] int64 on the rows' device: the rows each expert was sent (its load)
};

// One MoE layer's routing as its first forward decided it, kept while the layer's activations
// are checkpointed (model/activation_checkpointing.h): the recomputation in backward replays it
// (the same experts per token and, under expert parallelism, the same dispatch layout) and never
// routes again, so that a choice that would come out otherwise the second time (nondeterministic
// kernels, ties) can neither change the gradients nor disagree with the other ranks' exchanges.
// It lives as long as the autograd graph that needs it.
struct RoutingRecord {
  at::Tensor experts;             // [N, k] int64: the chosen experts
  at::Tensor routerLogits;        // [N, E] fp32: the last forward's (the recomputed one's has a graph)
  std::vector<int64_t> counts;    // rows per expert, where the host needed them (empty: it did not)
  std::vector<int64_t> arrived;   // expert parallelism: rows from each rank for each local expert
};
// What a MoE layer's forward does with a RoutingRecord.
enum class RoutingMode {
  kRoute,   // route; no record
  kRecord,  // route, and keep the decision in the record
  kReplay,  // take the decision from the record
};

// The router in fp32 over x [N, H]: softmax top-k (mixtral renormalises, qwen*_moe where
// norm_topk_prob says), or deepseek_v3's sigmoid scores with the correction bias added for the
// choice only, group-limited (the n_group groups scored by their best two, topk_group kept) and
// scaled by routed_scaling_factor. With `chosen` ([N, k] int64) the experts are those, and only
// their weights are computed.
Routing routeTokens(const planner::ModelConfig& config, const at::Tensor& x, const MoeWeights& w,
                    const at::Tensor& chosen = {});

using LinearFn = at::Tensor (*)(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// The experts' MLPs over rows grouped by expert, dropless: `rows` [R, H] hold counts[0] rows
// for the first of `w`'s experts, then counts[1] for the next, and so on. Every expert runs, an
// empty group included, so each has a gradient (zero when it got no token) and the ranks' ZeRO
// collectives stay in step. Each computes down(activation(gate(x), up(x))), the activation and
// whether gate and up run as one GEMM as `mlp` says. Returns [R, H]. On a GPU in bf16, one
// grouped GEMM per projection (at::_grouped_mm); elsewhere GEMMs per expert through `linear`.
at::Tensor groupedExpertMlp(const at::Tensor& rows, const std::vector<int64_t>& counts, const MoeWeights& w,
                            LinearFn linear, const planner::ExpertMlpConfig& mlp);
// The routed experts' activation over gate and up, [R, I] each.
at::Tensor expertActivation(const planner::ExpertMlpConfig& mlp, const at::Tensor& gate, const at::Tensor& up);

// The whole block over x [N, H] -> [N, H], its routing returned through `routing`. Under expert
// parallelism (`ep` not null) the tokens travel to the ranks that own their experts and back.
// Without it, on a GPU in bf16, the group sizes never leave the device: the host queues the rest
// of the model without waiting for the router. `record` is read or written as `mode` says.
at::Tensor moeForward(const planner::ModelConfig& config, const at::Tensor& x, const MoeWeights& w, LinearFn linear,
                      ExpertParallel* ep, Routing* routing, RoutingMode mode = RoutingMode::kRoute,
                      RoutingRecord* record = nullptr);

// Accumulates transformers' load_balancing_loss_func over the layers of one forward: per expert,
// the fraction of top-k assignments (as the softmax of the router logits picks them) and the mean
// routing probability, over all the layers' rows; the loss is E * sum(fraction * probability).
class LoadBalancingLoss {
 public:
  void add(const at::Tensor& routerLogits, int64_t topK);
  // Undefined when no layer was added.
  at::Tensor value(int64_t numExperts) const;
  void clear();

 private:
  at::Tensor assignments_, probabilities_;  // [E] fp32 sums over the layers' rows
  int64_t rows_ = 0;
};

}  // namespace loom::worker
