"""Per-token log-probabilities of the labels under a Hugging Face causal LM, in float32 (sdpa).

  python3 hf_logprobs.py --model DIR --data FILE.tokens --seq-len N --samples K --out FILE.safetensors

Takes the first K samples in file order (sample i = tokens[i*seq_len : i*seq_len + seq_len + 1], no
shuffling), writes tensor "logprobs" [K, seq_len] float32 (log p(label_t | inputs_<=t)) and prints
{"samples": K, "mean_loss": ...} as one JSON line (mean_loss = -mean(logprobs)).
"""
import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from token_file import num_samples, read_token_file, sample


def load_model(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=8,
                   help="samples per forward pass (grouping only; batch 1 and 8 were bit-identical)")
    a = p.parse_args()

    torch.manual_seed(0)
    _, tokens = read_token_file(a.data)
    n = num_samples(len(tokens), a.seq_len)
    if a.samples > n:
        raise SystemExit(f"--samples {a.samples} > {n} samples in {a.data} at seq_len {a.seq_len}")
    model = load_model(a.model)

    rows = []
    with torch.no_grad():
        for begin in range(0, a.samples, a.batch):
            pairs = [sample(tokens, i, a.seq_len) for i in range(begin, min(a.samples, begin + a.batch))]
            inputs = torch.from_numpy(np.stack([x for x, _ in pairs]))
            labels = torch.from_numpy(np.stack([y for _, y in pairs]))
            logits = model(input_ids=inputs).logits.float()
            logp = F.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            rows.append(logp)
    logprobs = torch.cat(rows).contiguous()
    save_file({"logprobs": logprobs}, a.out)
    print(json.dumps({"samples": a.samples, "mean_loss": -logprobs.double().mean().item()}))


if __name__ == "__main__":
    main()
