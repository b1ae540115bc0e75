#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/communicator.h"
#include "common/status.h"
#include "planner/model_config.h"
#include "worker/torch/checkpoint/safetensors.h"
#include "worker/torch/model/activation_checkpointing.h"
#include "worker/torch/model/flops_profile.h"
#include "worker/torch/model/latent_attention.h"
#include "worker/torch/model/moe.h"
#include "worker/torch/model/paged_kv.h"
#include "worker/torch/model/rope.h"
#include "worker/torch/model/token_layout.h"
#include "worker/torch/parallel/expert_parallel.h"
#include "worker/torch/parallel/tensor_shards.h"
#include "worker/torch/parallel/vocab_parallel.h"

namespace loom::worker {

class DecoderModel;

// How this rank's model is cut over its tensor-parallel group: every parameter's layout, in HF
// order, from the Plan (parallel/tensor_shards.h). With `tp` of size 1 every layout is whole.
// `sp`, the sequence-parallel group, shares the tokens of each sample (parameters are whole over
// it); null or of size 1, each rank sees whole samples.
// `ep`, the expert-parallel group, splits each MoE layer's experts: this rank holds experts
// rank*E/ep to (rank+1)*E/ep - 1 and `layouts` covers the parameters it holds only (the Plan's
// planOfRank); null or of size 1, every expert.
struct ModelShards {
  std::shared_ptr<backends::Communicator> tp;
  std::vector<ShardLayout> layouts;
  std::shared_ptr<backends::Communicator> sp;
  std::shared_ptr<backends::Communicator> ep;
};

// Runs the model's blocks when something must happen around each (ZeRO stage 3 gathers a
// block's parameters before it and releases them after). Without one, blocks run directly.
class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  // Must return model.block(index, input), however it arranges for the parameters.
  virtual at::Tensor run(DecoderModel& model, int index, const at::Tensor& input) = 0;
};

// A Llama-family decoder (llama, mistral, qwen2, qwen3) computing what Hugging Face's
// *ForCausalLM computes: RMSNorm, split-half RoPE (default, linear, llama3 or yarn frequencies),
// grouped-query causal attention (optionally windowed), SwiGLU MLP, tied or untied head; and the
// mixture-of-experts decoders (mixtral, qwen2_moe, qwen3_moe, deepseek_v3 with its latent
// attention), whose MoE layers route each token to its top-k experts (model/moe.h) and whose
// router load-balancing loss joins the loss where the config asks for it. Its
// parameters are exactly those the planner enumerates for the config (names and shapes as HF
// has them), so HF safetensors load as they are and what it saves loads into HF.
//
// Under tensor parallelism (AutoTP's layout, as the Plan gives it) each rank holds its pieces:
// q/k/v and gate/up split by output features (column-parallel: the input's gradient is summed
// over the group), o_proj and down_proj by input features (row-parallel: their outputs are summed
// over the group, then their biases added once, whole), the embedding and the head by vocabulary
// (the lookup masks other ranks' ids and sums; the head's logits stay split and the losses are
// vocabulary-parallel). Norms are whole; the q/k norms, which each rank applies to its own heads
// only, get their gradients summed over the group, and so do KV heads shared by several ranks. A
// tied embedding is one piece serving as embedding and head, with one gradient.
//
// Under sequence parallelism (Ulysses) each rank of the sp group takes a contiguous 1/sp of every
// sample's tokens through the embedding, the MLPs and the head; attention exchanges the sequence
// shard of all heads for the whole sequence of 1/sp of the heads (parallel/sequence_parallel.h),
// with RoPE at the tokens' true positions. Packed documents (TokenLayout) restart positions at
// each document and confine attention to it.
class DecoderModel {
 public:
  // Parameters are allocated (uninitialised) in `dtype`, in this rank's shapes; call initRandom or
  // loadWeights. `shards` empty: the whole model on one rank.
  static StatusOr<std::unique_ptr<DecoderModel>> create(const planner::ModelConfig& config, at::ScalarType dtype,
                                                        at::Device device = at::kCPU, ModelShards shards = {});

  // HF's init: linear and embedding weights ~ N(0, initializer_range), biases 0, norms 1. The
  // same seed gives the same weights on every rank (each its pieces of the same whole tensors).
  void initRandom(int64_t seed);
  // Copies every parameter (this rank's piece of it) from `weights`, whole HF tensors, cast to the
  // model's dtype. Missing, unexpected or misshapen tensors are errors naming the tensor and
  // `source`; a tied model ignores a stored lm_head.weight. Every tensor is checked before any is
  // copied, so refused weights leave the model as it was.
  Status loadWeights(const TensorMap& weights, const std::string& source);

  const planner::ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }
  // In HF order, in this rank's shapes.
  const std::vector<std::pair<std::string, at::Tensor>>& parameters() const { return parameters_; }
  const ModelShards& shards() const { return shards_; }
  backends::Communicator& tensorParallel() const { return *shards_.tp; }
  backends::Communicator& sequenceParallel() const { return *shards_.sp; }

  // tokens [B, s] (int64) -> logits [B, s, V / tp] in the model's dtype: under tensor parallelism,
  // this rank's columns of the vocabulary (vocabStart() on). Under sequence parallelism `tokens`
  // are this rank's share of the samples (s = S / sp), as `layout` describes them.
  at::Tensor logits(const at::Tensor& tokens, const TokenLayout& layout = {});
  int64_t vocabStart() const { return vocabStart_; }

  // The forward pass as a chain of blocks: 0 the embedding (tokens in), 1..L the decoder layers,
  // L + 1 the final norm and the head (logits out). Blocks run inside logits(), which prepares
  // the batch's positions and attention mask for them.
  int numBlocks() const { return static_cast<int>(config_.numLayers) + 2; }
  // With activation checkpointing on (setActivationCheckpointing) and gradients wanted, a decoder
  // layer's block keeps only its input and recomputes the rest in backward.
  at::Tensor block(int index, const at::Tensor& input);
  // A decoder layer's block (index 1..L) as such, never checkpointed, its MoE routing done,
  // recorded into or replayed from `record` as `mode` says (model/moe.h).
  at::Tensor decoderLayer(int index, const at::Tensor& input, RoutingMode mode = RoutingMode::kRoute,
                          RoutingRecord* record = nullptr);
  void setActivationCheckpointing(const ActivationCheckpointing& options) { checkpointing_ = options; }
  // Indices into parameters() of the parameters block `index` uses.
  const std::vector<int>& blockParameters(int index) const { return blockParameters_[index]; }
  void setBlockRunner(BlockRunner* runner) { runner_ = runner; }
  // How the model's linear layers run: at::linear unless replaced (ZeRO-3 needs one whose
  // backward keeps the weight parameter itself, not a view of its data).
  using LinearFn = worker::LinearFn;
  void setLinear(LinearFn linear) { linear_ = linear; }
  // DeepSpeed's flops profiler: the forwards this thread runs while `profile` is set record into
  // it (model/flops_profile.h); null ends that. Not for a forward under way.
  void setFlopsProfile(FlopsProfile* profile);
  // Mean cross-entropy of the next-token predictions over the labels that are not -100: inputs
  // and labels [B, s], as logits() takes them. With output_router_logits, plus
  // router_aux_loss_coef x the router's load-balancing loss over this forward (transformers'
  // load_balancing_loss_func), which auxLoss() then holds.
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& labels, const TokenLayout& layout = {});
  // After a logits() that trains (a loss of the caller's own): router_aux_loss_coef x the router's
  // load-balancing loss over that forward, to add to the loss; undefined without one. auxLoss()
  // then holds it.
  at::Tensor takeRouterAuxLoss();
  // The load-balancing loss of the last loss() or takeRouterAuxLoss() (before its coefficient);
  // undefined without one.
  const at::Tensor& auxLoss() const { return auxLoss_; }
  // Rows sent to each expert, summed over the MoE layers and the forwards since the last
  // takeExpertLoad() ([E] int64 on the host; empty for a dense model): the experts' load.
  std::vector<int64_t> takeExpertLoad();
  // Under expert parallelism, the dispatch to the ranks that own the experts; null otherwise.
  ExpertParallel* expertParallel() const { return expertParallel_.get(); }
  // Over logits as logits() returns them, rows [N, V / tp] and labels [N]: the mean
  // cross-entropy, log p(label), the softmax's entropy and KL(teacher || this) per row, in fp32.
  // They are vocabulary-parallel over the tensor-parallel group, in blocks of rows that never
  // make an fp32 copy of the logits (parallel/vocab_parallel.h); on one rank, a kernel plugin that
  // took the cross entropy and logprobs over runs them instead.
  at::Tensor crossEntropy(const at::Tensor& logits, const at::Tensor& labels);
  at::Tensor tokenLogprobs(const at::Tensor& logits, const at::Tensor& labels);
  at::Tensor tokenEntropy(const at::Tensor& logits);
  at::Tensor tokenKl(const at::Tensor& logits, const at::Tensor& teacherLogits);
  // This rank's columns of the vocabulary, for the vocabulary-parallel ops of a loss of its own.
  VocabShard vocabShard() const { return {shards_.tp.get(), vocabStart_, lossBlockRows_}; }
  // Rollout (decoder_model_paged.cc): a KV cache of `numBlocks` blocks for this rank's KV heads,
  // in the model's dtype and on its device, serving positions below maxModelLen; and the next-token
  // logits [R, V / tp] of a step's tokens [T] (int64), step.logitRows' rows only, with the step's
  // keys and values written into the cache. Without autograd.
  PagedKvCache createKvCache(int64_t numBlocks, int64_t blockSize, int64_t maxModelLen) const;
  int64_t kvCacheBytesPerBlock(int64_t blockSize) const;
  at::Tensor pagedLogits(const at::Tensor& tokens, const PagedStep& step, PagedKvCache& cache);
  // For inference only (rollout): each layer's q, k and v weights (and biases), and its gate and
  // up weights, become row blocks of one tensor, so that a step computes each group with one GEMM
  // (vLLM's QKVParallelLinear and MergedColumnParallelLinear): at a decode step's few rows a GEMM
  // is bound by reading its weight, and one wide GEMM reads it faster than three narrow ones. The
  // parameters become views of the fused tensors (loadWeights still writes them in place), which
  // autograd cannot train. One layer at a time, so that the copy needs one layer's memory.
  void fuseProjections();
  // Rows per block of those losses (model.loss_block_rows); 0: as many as fit 2^24 logits.
  void setLossBlockRows(int64_t rows) { lossBlockRows_ = rows; }

 private:
  struct Layer {
    at::Tensor inputNorm, q, k, v, o, qBias, kBias, vBias, oBias, qNorm, kNorm;
    at::Tensor postNorm, gate, up, down, gateBias, upBias, downBias;
    // After fuseProjections: [q; k; v] and [gate; up] by rows (q, k, v, gate and up are views of
    // them), with their biases where the layer has them. Undefined otherwise.
    at::Tensor qkv, qkvBias, gateUp, gateUpBias;
    ShardLayout kvLayout;  // k_proj's (v_proj's is the same): KV heads shared by several ranks
    LatentAttentionWeights latent;  // deepseek_v3's attention (in place of q, k, v)
    bool moe = false;               // experts in place of gate, up and down
    MoeWeights experts;
    int64_t index = 0;              // its place among the decoder layers, from 0
  };

  DecoderModel(const planner::ModelConfig& config, at::ScalarType dtype, at::Device device, ModelShards shards);
  const ShardLayout& layoutOf(int parameter) const { return shards_.layouts[parameter]; }
  // The named parameter; undefined for optional ones the config leaves out (biases, q/k norms).
  at::Tensor parameter(const std::string& name) const;
  void bindLayers();
  at::Tensor attentionBlock(const Layer& layer, const at::Tensor& x);
  // Attention over this rank's heads and the whole sequence: q [B, S, Hq, D], k and v [B, S,
  // Hkv, D], RoPE applied -> [B, S, Hq * D].
  at::Tensor attendWhole(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  at::Tensor mlpBlock(const Layer& layer, const at::Tensor& x);
  // attentionBlock's rollout form: x [1, T, hidden], keys and values written to the cache.
  at::Tensor pagedAttentionBlock(const Layer& layer, const at::Tensor& x);
  at::Tensor moeBlock(const Layer& layer, const at::Tensor& x, RoutingMode mode, RoutingRecord* record);
  // A decoder layer past its input norm (`normed` of `input`): attention, the residual add with
  // the post-attention norm, the MLP. Returns the residual stream after attention and the MLP's
  // output, which the caller adds: decoderLayer at once, the rollout forward in one op with the
  // next layer's input norm.
  std::pair<at::Tensor, at::Tensor> layerPastInputNorm(const Layer& layer, const at::Tensor& input,
                                                       const at::Tensor& normed, RoutingMode mode,
                                                       RoutingRecord* record);
  // The head of the final norm's output: this rank's columns of the logits.
  at::Tensor headLogits(const at::Tensor& normed);
  // Whether block `index`'s backward computes anything: its input or a parameter wants a gradient.
  bool needsGradient(int index, const at::Tensor& input) const;
  at::Tensor latentAttentionBlock(const Layer& layer, const at::Tensor& x);
  void bindExperts(Layer& layer, const std::string& prefix);
  // A row-parallel linear layer (o_proj, down_proj): this rank's input features, outputs summed over
  // the tensor-parallel group, the bias added once.
  at::Tensor rowParallel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
  // cos and sin [S, head_dim] for positions 0..S-1, in the model's dtype (cached per S).
  std::pair<at::Tensor, at::Tensor> rotary(int64_t seqLen);
  // The batch's RoPE angles and attention mask, for the blocks that follow: tokens [B, s].
  void prepareBatch(const at::Tensor& tokens, const TokenLayout& layout);

  planner::ModelConfig config_;
  at::ScalarType dtype_;
  at::Device device_;
  ModelShards shards_;
  int64_t heads_ = 0, kvHeads_ = 0;  // this rank's query and KV heads
  int64_t vocabStart_ = 0;           // this rank's first vocabulary row
  int64_t lossBlockRows_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;
  std::unordered_map<std::string, int> index_;  // into parameters_, by name
  at::Tensor embed_, finalNorm_, head_;
  std::vector<Layer> layers_;
  std::vector<std::vector<int>> blockParameters_;
  BlockRunner* runner_ = nullptr;
  LinearFn linear_;
  LinearFn unprofiledLinear_ = nullptr;  // linear_ while a flops profile is set
  FlopsProfile* profile_ = nullptr;
  std::unique_ptr<ExpertParallel> expertParallel_;
  ActivationCheckpointing checkpointing_;
  LoadBalancingLoss loadBalancing_;  // of the forward in flight, with output_router_logits
  at::Tensor auxLoss_;
  at::Tensor expertLoad_;  // [E] int64 on the model's device, summed until takeExpertLoad()
  at::Tensor inverseFrequencies_;  // [head_dim / 2], fp32
  int64_t rotarySeqLen_ = 0;
  at::Tensor cos_, sin_;
  // The batch in flight (prepareBatch): cos and sin of its tokens' positions, [s, D] or with
  // packed documents [B, s, D]; the keys each query may see, [B, 1, S, S] bool (undefined:
  // causal).
  at::Tensor batchCos_, batchSin_, attentionMask_;
  // The rollout step in flight (pagedLogits); null otherwise.
  const PagedStep* pagedStep_ = nullptr;
  PagedKvCache* kvCache_ = nullptr;
};

}  // namespace loom::worker
