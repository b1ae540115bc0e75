#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "planner/model_config.h"
#include "worker/torch/model/moe.h"

namespace loom::worker {

// DeepSeek-V3's multi-head latent attention weights (HF names after self_attn.); q is q_proj
// when there is no query latent (q_lora_rank null), else q_a_proj, its norm and q_b_proj.
struct LatentAttentionWeights {
  at::Tensor q, qA, qABias, qANorm, qB;
  at::Tensor kvA, kvABias, kvANorm, kvB;
};

// The attention of DeepseekV3Attention before o_proj, over x [B, S, H] -> [B, S, heads *
// v_head_dim] for this rank's `heads` (q_b_proj and kv_b_proj split by heads under tensor
// parallelism; the latents are whole). cos and sin are the rotary tables of the batch's positions
// ([S, r] or [B, S, r], yarn's attention factor applied); `allowed` as ops().attention takes it.
// Interleaved rotary pairs (rope_interleave) are gathered into halves first, which rotates them
// exactly as HF's interleaved form does; the softmax scale is HF's, yarn's mscale included.
at::Tensor latentAttention(const planner::ModelConfig& config, const LatentAttentionWeights& w, const at::Tensor& x,
                           int64_t heads, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& allowed,
                           LinearFn linear);

}  // namespace loom::worker
