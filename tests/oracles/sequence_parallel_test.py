"""Ulysses sequence parallelism against one rank and transformers, end to end through `loomctl run`
(real loomd, 4 real CPU ranks over UCX):

1. Training: 20 fp32 steps of the same global batch on 4 ranks laid out sp2 x dp2 (ZeRO 0 and 3),
   sp4 and sp2 x tp2, and on 8 as sp2 x tp2 x dp2 (ZeRO 1), against the same job on 1 rank,
   without and with packed documents
   (data.pack_documents): losses within 1e-5 relative at every step (the first within 1e-6),
   gradient norms within 1e-5, final weights (the checkpoint's whole HF tensors) within 1e-5. The
   tiny models' 2 KV heads split over sp2 and are copied to 2 ranks each at sp4 and at sp2 x tp2;
   qwen3 adds the q/k norms. seq_parallel_communication_data_type bf16 (ZeRO 0 and 3) stays within
   bf16's rounding of them.
2. Eval: logprobs at sp2 equal transformers' within 1e-5; with packed documents they equal
   transformers run on each document (each piece a sample holds) separately, and the label that
   would cross into the next document is not counted.
3. Refusals at submit: heads and KV heads that do not split over sp (and over tp x sp), a sequence
   length sp does not divide, and sp x tp that does not divide the world.

  python3 tests/oracles/sequence_parallel_test.py --bin build/bin
"""
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import parity_test  # noqa: E402
from make_tiny_model import make_config  # noqa: E402
from parity_test import (check, compare_with_one_rank, final_weights, refused_at_submit, loom_losses,  # noqa: E402
                         loom_run)
from token_file import sample, write_token_file  # noqa: E402

SEQ, STEPS, VOCAB = 24, 20, 300


def save_model(family, out, seed, **overrides):
    torch.manual_seed(seed)
    config = make_config(family, VOCAB, False, False)
    for key, value in overrides.items():
        setattr(config, key, value)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return model


def train_spec(name, model_dir, data, ranks, sp, tp, zero, checkpoints, packed, **deepspeed):
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
          "steps_per_print": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 3e-3, "warmup_num_steps": 5}},
          "zero_optimization": zero}
    if sp > 1:
        ds["sequence_parallel_size"] = sp
    if tp > 1:
        ds["tensor_parallel"] = {"autotp_size": tp}
    ds.update(deepspeed)
    return {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": SEQ, "seed": 4, "pack_documents": packed},
            "train": {"steps": STEPS, "checkpoint_dir": checkpoints}, "deepspeed": ds}


def training(bin_dir, work, data):
    cases = {
        "llama": dict(family="llama", runs={
            "sp2-zero0": (2, 1, {"stage": 0}),
            "sp2-zero3": (2, 1, {"stage": 3, "stage3_param_persistence_threshold": 100}),
            "sp4-zero1": (4, 1, {"stage": 1}),
            "sp2-tp2-zero0": (2, 2, {"stage": 0})}),
        "qwen3": dict(family="qwen3", runs={"sp2-zero2": (2, 1, {"stage": 2})}),
    }
    for packed in (False, True):
        for model_name, case in cases.items():
            model_dir = os.path.join(work, model_name)
            if not os.path.exists(model_dir):
                save_model(case["family"], model_dir, seed=len(model_name))
            tag = model_name + ("-packed" if packed else "")
            reference_dir = os.path.join(work, tag + "-1rank")
            reference_log = loom_run(bin_dir, train_spec(tag + "-1rank", model_dir, data, 1, 1, 1, {"stage": 0},
                                                         reference_dir, packed), work, tag + "-1rank")
            reference_weights = final_weights(reference_dir, STEPS)
            logs = {}
            for run, (sp, tp, zero) in case["runs"].items():
                name = f"{tag}-{run}"
                checkpoints = os.path.join(work, name)
                log = loom_run(bin_dir, train_spec(name, model_dir, data, 4, sp, tp, zero, checkpoints, packed),
                               work, name)
                check(f"sp {sp}" in log, f"{name}: rank 0 reports its mesh ({sp} sequence-parallel ranks)")
                compare_with_one_rank(name, log, final_weights(checkpoints, STEPS), reference_log, reference_weights,
                                      first_step=1e-6, norm_tolerance=2e-5)
                logs[run] = log
            if model_name != "llama":
                continue
            eight_ranks(bin_dir, work, data, packed, reference_log, reference_weights)
            if not packed:
                bf16_wire(bin_dir, work, data, model_dir, reference_log,
                          {0: loom_losses(logs["sp2-zero0"]), 3: loom_losses(logs["sp2-zero3"])})


def bf16_wire(bin_dir, work, data, model_dir, reference_log, fp32_wire_losses):
    """seq_parallel_communication_data_type bf16: ZeRO 0 and 3 reduce the gradients in bf16, so
    the runs depart from the fp32 ones by bf16's rounding, and no further."""
    for stage, zero in ((0, {"stage": 0}), (3, {"stage": 3, "stage3_param_persistence_threshold": 100})):
        name = f"llama-sp2-zero{stage}-bf16-wire"
        spec = train_spec(name, model_dir, data, 4, 2, 1, zero, os.path.join(work, name), False,
                          seq_parallel_communication_data_type="bf16")
        losses, reference = loom_losses(loom_run(bin_dir, spec, work, name)), loom_losses(reference_log)
        worst = max(abs(losses.get(s, 0) - l) / l for s, l in reference.items())
        check(len(losses) == STEPS and losses != fp32_wire_losses[stage] and 1e-7 < worst <= 1e-2,
              f"{name}: losses vs 1 rank within bf16's rounding, worst relative difference {worst:.2e}")


def eight_ranks(bin_dir, work, data, packed, reference_log, reference_weights):
    """sp2 x tp2 x dp2 at ZeRO 1: the three axes together, on 8 ranks."""
    name = "llama" + ("-packed" if packed else "") + "-sp2-tp2-dp2-zero1"
    checkpoints = os.path.join(work, name)
    log = loom_run(bin_dir, train_spec(name, os.path.join(work, "llama"), data, 8, 2, 2, {"stage": 1}, checkpoints,
                                       packed), work, name)
    check("tp 2 x sp 2 x dp 2" in log, f"{name}: rank 0 reports its mesh (tp 2 x sp 2 x dp 2)")
    compare_with_one_rank(name, log, final_weights(checkpoints, STEPS), reference_log, reference_weights,
                          first_step=1e-6, norm_tolerance=2e-5)


def documents_of(starts, first, width):
    """The document index of tokens [first, first + width) of the file."""
    return np.searchsorted(np.asarray(starts), np.arange(first, first + width), side="right")


def evaluation(bin_dir, work, data, tokens, starts):
    samples = 8
    model_dir = os.path.join(work, "eval-llama")
    model = save_model("llama", model_dir, seed=9).eval()
    pairs = [sample(tokens, i, SEQ) for i in range(samples)]
    inputs = torch.from_numpy(np.stack([x for x, _ in pairs])).long()
    labels = torch.from_numpy(np.stack([y for _, y in pairs])).long()
    with torch.no_grad():
        whole = torch.log_softmax(model(input_ids=inputs).logits.float(), -1)
        whole = whole.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        # Each document piece of each sample on its own, positions from 0; a label in the next
        # document counts for nothing (0).
        separate = torch.zeros(samples, SEQ)
        counted = 0
        for i in range(samples):
            docs = documents_of(starts, i * SEQ, SEQ + 1)
            t = 0
            while t < SEQ:
                end = t
                while end + 1 < SEQ and docs[end + 1] == docs[t]:
                    end += 1
                piece = inputs[i:i + 1, t:end + 1]
                logp = torch.log_softmax(model(input_ids=piece).logits.float(), -1)[0]
                for j in range(t, end + 1):
                    if docs[j + 1] == docs[j]:
                        separate[i, j] = logp[j - t, labels[i, j]]
                        counted += 1
                t = end + 1
    for packed, theirs in ((False, whole), (True, separate)):
        name = "eval-sp2" + ("-packed" if packed else "")
        out = os.path.join(work, name + ".safetensors")
        log = loom_run(bin_dir, {
            "name": name, "kind": "eval", "resources": {"ranks": 4},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"eval": data, "seq_len": SEQ, "pack_documents": packed},
            "eval": {"logprobs_output": out, "max_batches": 2},
            "deepspeed": {"train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 2}}, work, name)
        ours = load_file(out)["logprobs"]
        rows = ours.shape[0]
        diff = (ours - theirs[:rows]).abs().max().item()
        check(rows == samples and diff <= 1e-5,
              f"{name}: {rows} rows of logprobs vs transformers{' per document' if packed else ''}, "
              f"max |difference| = {diff:.2e}")
        tokens_counted = int(re.search(r"\((\d+) tokens\)", log).group(1)) if "tokens)" in log else -1
        expected = counted if packed else samples * SEQ
        mean = -theirs.sum().item() / expected
        loss = float(re.search(r"eval: loss (\S+)", log).group(1)) if "eval: loss" in log else float("nan")
        check(tokens_counted == expected and abs(loss - mean) <= 1e-5,
              f"{name}: the mean loss over the {expected} labels that count ({loss:.6f} vs {mean:.6f})")


def refusals(bin_dir, work, data):
    model_dir = os.path.join(work, "refusals")
    save_model("llama", model_dir, seed=2)
    odd_kv_dir = os.path.join(work, "refusals-kv3")
    save_model("llama", odd_kv_dir, seed=2, hidden_size=96, num_attention_heads=6, num_key_value_heads=3)
    spec = lambda ranks, sp, tp=1, model=model_dir: train_spec(  # noqa: E731
        "refused", model, data, ranks, sp, tp, {"stage": 0}, os.path.join(work, "refused"), False)
    long_seq = spec(4, 2)
    long_seq["data"]["seq_len"] = 25
    cases = {
        "heads": (spec(8, 8), "sequence_parallel_size 8: num_attention_heads 4 is not a multiple of it"),
        "kv-heads": (spec(2, 2, model=odd_kv_dir),
                     "sequence_parallel_size 2: num_key_value_heads 3 neither splits into it nor divides it"),
        "tp-heads": (spec(8, 4, 2), "sequence_parallel_size 4: the 2 attention heads of a tensor-parallel rank "
                                    "(num_attention_heads 4 / tensor parallel 2) are not a multiple of it"),
        "seq-len": (long_seq, "sequence_parallel_size 2: the sequence length 25 is not a multiple of it"),
        "world": (spec(6, 4), "resources.ranks 6 cannot be split into deepspeed.tensor_parallel.autotp_size 1 x "
                              "deepspeed.sequence_parallel_size 4: 6 is not a multiple of 4"),
    }
    for name, (s, expected) in cases.items():
        refused_at_submit(bin_dir, work, name, s, expected)


def main():
    a = oracle_args(__doc__, only=["training", "evaluation", "refusals"])
    bin_dir = a.bin
    with tempfile.TemporaryDirectory(prefix="loom-sp-") as work:
        rng = np.random.default_rng(5)
        tokens = rng.integers(0, VOCAB, 64 * SEQ + 1)
        # Documents of 2 to 17 tokens: several per sample, some across a sample's end.
        starts = [0]
        while starts[-1] < len(tokens):
            starts.append(starts[-1] + int(rng.integers(2, 18)))
        starts = starts[:-1]
        data = os.path.join(work, "sp.tokens")
        write_token_file(data, tokens, VOCAB, "uint16", document_starts=starts)
        if a.only in (None, "refusals"):
            refusals(bin_dir, work, data)
        if a.only in (None, "evaluation"):
            evaluation(bin_dir, work, data, tokens, starts)
        if a.only in (None, "training"):
            training(bin_dir, work, data)
    if parity_test.failures:
        raise SystemExit(f"{len(parity_test.failures)} checks failed")


if __name__ == "__main__":
    main()
