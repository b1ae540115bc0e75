"""Creates a small random Hugging Face causal LM and saves it with save_pretrained (safetensors).

  python3 make_tiny_model.py --family llama|qwen2|qwen3|mistral --out DIR --seed S [--vocab 300] [--tie]
                             [--llama3-rope]
  python3 make_tiny_model.py --family mixtral|qwen2_moe|qwen3_moe|deepseek_v3 --out DIR --seed S

All families: hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16, intermediate 128,
max_position_embeddings 256. mistral: sliding_window 8. --llama3-rope (llama only): rope type llama3
with factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 64.
"""
import argparse

import torch
import transformers

FAMILIES = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
    "mistral": transformers.MistralConfig,
}


# Mixture-of-experts families, each with what its routing does differently: mixtral (softmax top-2,
# renormalised), qwen2_moe (shared expert behind its sigmoid gate, a dense layer by
# mlp_only_layers, the load-balancing loss), qwen3_moe (q/k norms, norm_topk_prob, dense layers
# by decoder_sparse_step), deepseek_v3 (latent attention with a query latent, yarn, a dense first
# layer, group-limited sigmoid routing over 4 groups of which 2, routed_scaling_factor, a shared
# expert).
MOE_FAMILIES = {
    "mixtral": lambda vocab: transformers.MixtralConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=256, sliding_window=None),
    "qwen2_moe": lambda vocab: transformers.Qwen2MoeConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1], output_router_logits=True,
        router_aux_loss_coef=0.02, max_position_embeddings=256, use_sliding_window=False),
    "qwen3_moe": lambda vocab: transformers.Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=2, max_position_embeddings=256),
    "deepseek_v3": lambda vocab: transformers.DeepseekV3Config(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
        q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0}),
}


def make_moe_model(family, vocab=300, seed=0):
    """A random MoE model of `family` in fp32; deepseek_v3's score-correction biases drawn too, so
    that they change which experts are chosen."""
    torch.manual_seed(seed)
    config = MOE_FAMILIES[family](vocab)
    config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.rand_like(buffer) * 0.1)
    return model


def make_config(family, vocab, tie, llama3_rope):
    kwargs = dict(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=tie,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    if family == "mistral":
        kwargs["sliding_window"] = 8
    if llama3_rope:
        if family != "llama":
            raise SystemExit("--llama3-rope is for --family llama only")
        kwargs["rope_parameters"] = {
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        }
    return FAMILIES[family](**kwargs)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, choices=sorted(FAMILIES) + sorted(MOE_FAMILIES))
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=300)
    p.add_argument("--tie", action="store_true", help="tie_word_embeddings")
    p.add_argument("--llama3-rope", action="store_true", help="llama: rope_type llama3 scaling")
    a = p.parse_args()
    if a.family in MOE_FAMILIES:
        model = make_moe_model(a.family, a.vocab, a.seed)
    else:
        torch.manual_seed(a.seed)
        config = make_config(a.family, a.vocab, a.tie, a.llama3_rope)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(a.out, safe_serialization=True)
    print(f"saved {a.family} ({sum(p.numel() for p in model.parameters())} parameters) to {a.out}")


if __name__ == "__main__":
    main()
