"""Creates a small random Hugging Face causal LM and saves it with save_pretrained (safetensors).

  python3 make_tiny_model.py --family llama|qwen2|qwen3|mistral --out DIR --seed S [--vocab 300] [--tie]
                             [--llama3-rope]

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
    p.add_argument("--family", required=True, choices=sorted(FAMILIES))
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=300)
    p.add_argument("--tie", action="store_true", help="tie_word_embeddings")
    p.add_argument("--llama3-rope", action="store_true", help="llama: rope_type llama3 scaling")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    config = make_config(a.family, a.vocab, a.tie, a.llama3_rope)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(a.out, safe_serialization=True)
    print(f"saved {a.family} ({sum(p.numel() for p in model.parameters())} parameters) to {a.out}")


if __name__ == "__main__":
    main()
