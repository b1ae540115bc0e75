#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "planner/model_config.h"
#include "worker/torch/safetensors.h"

namespace loom::worker {

class DecoderModel;

// Runs the model's blocks when something must happen around each (ZeRO stage 3 gathers a
// block's parameters before it and releases them after). Without one, blocks run directly.
class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  // Must return model.block(index, input), however it arranges for the parameters.
  virtual at::Tensor run(DecoderModel& model, int index, const at::Tensor& input) = 0;
};

// A Llama-family decoder (llama, mistral, qwen2, qwen3) computing what Hugging Face's
// *ForCausalLM computes: RMSNorm, split-half RoPE (default, linear or llama3 frequencies),
// grouped-query causal attention (optionally windowed), SwiGLU MLP, tied or untied head. Its
// parameters are exactly those the planner enumerates for the config (names and shapes as HF
// has them), so HF safetensors load as they are and what it saves loads into HF.
class DecoderModel {
 public:
  // Parameters are allocated (uninitialised) in `dtype`; call initRandom or loadWeights.
  static StatusOr<std::unique_ptr<DecoderModel>> create(const planner::ModelConfig& config, at::ScalarType dtype,
                                                        at::Device device = at::kCPU);

  // HF's init: linear and embedding weights ~ N(0, initializer_range), biases 0, norms 1. The
  // same seed gives the same weights on every rank.
  void initRandom(int64_t seed);
  // Copies every parameter from `weights` (cast to the model's dtype). Missing, unexpected or
  // misshapen tensors are errors naming the tensor and `source`; a tied model ignores a stored
  // lm_head.weight.
  Status loadWeights(const TensorMap& weights, const std::string& source);

  const planner::ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }
  // In HF order.
  const std::vector<std::pair<std::string, at::Tensor>>& parameters() const { return parameters_; }
  TensorMap stateDict() const;

  // tokens [B, S] (int64) -> logits [B, S, V] in the model's dtype.
  at::Tensor logits(const at::Tensor& tokens);

  // The forward pass as a chain of blocks: 0 the embedding (tokens in), 1..L the decoder layers,
  // L + 1 the final norm and the head (logits out).
  int numBlocks() const { return static_cast<int>(config_.numLayers) + 2; }
  at::Tensor block(int index, const at::Tensor& input);
  // Indices into parameters() of the parameters block `index` uses.
  const std::vector<int>& blockParameters(int index) const { return blockParameters_[index]; }
  void setBlockRunner(BlockRunner* runner) { runner_ = runner; }
  // How the model's linear layers run: at::linear unless replaced (ZeRO-3 needs one whose
  // backward keeps the weight parameter itself, not a view of its data).
  using LinearFn = at::Tensor (*)(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
  void setLinear(LinearFn linear) { linear_ = linear; }
  // Mean cross-entropy of the next-token predictions: inputs and labels [B, S].
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& labels);

 private:
  struct Layer {
    at::Tensor inputNorm, q, k, v, o, qBias, kBias, vBias, qNorm, kNorm;
    at::Tensor postNorm, gate, up, down, gateBias, upBias, downBias;
  };

  DecoderModel(const planner::ModelConfig& config, at::ScalarType dtype, at::Device device);
  // The named parameter; undefined for optional ones the config leaves out (biases, q/k norms).
  at::Tensor parameter(const std::string& name) const;
  void bindLayers();
  at::Tensor attentionBlock(const Layer& layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  at::Tensor mlpBlock(const Layer& layer, const at::Tensor& x);
  // cos and sin [S, head_dim] for positions 0..S-1, in the model's dtype (cached per S).
  std::pair<at::Tensor, at::Tensor> rotary(int64_t seqLen);

  planner::ModelConfig config_;
  at::ScalarType dtype_;
  at::Device device_;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;
  at::Tensor embed_, finalNorm_, head_;
  std::vector<Layer> layers_;
  std::vector<std::vector<int>> blockParameters_;
  BlockRunner* runner_ = nullptr;
  LinearFn linear_;
  at::Tensor inverseFrequencies_;  // [head_dim / 2], fp32
  int64_t rotarySeqLen_ = 0;
  at::Tensor cos_, sin_;
};

// RoPE inverse frequencies as HF computes them (fp32), for the config's rope type.
at::Tensor ropeInverseFrequencies(const planner::ModelConfig& config);

}  // namespace loom::worker
