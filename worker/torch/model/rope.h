#pragma once

#include <ATen/core/Tensor.h>

#include "planner/model_config.h"

namespace loom::worker {

// RoPE inverse frequencies as HF computes them (fp32, [head_dim / 2]), for the config's rope
// type: default, linear, llama3 or yarn.
at::Tensor ropeInverseFrequencies(const planner::ModelConfig& config);
// What HF multiplies the cos and sin tables by: yarn's attention factor (given, or from factor,
// mscale and mscale_all_dim); 1 for the other types.
double ropeAttentionFactor(const planner::ModelConfig& config);
// DeepSeek's yarn_get_mscale: 0.1 * mscale * ln(scale) + 1 above scale 1, else 1.
double yarnMscale(double scale, double mscale);

}  // namespace loom::worker
