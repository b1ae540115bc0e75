"""Mixture-of-experts models against transformers, and their training across layouts, end to end
through `loomctl run` (real loomd, real CPU ranks over UCX):

1. HF parity: for mixtral, qwen2_moe (shared expert, a dense layer by mlp_only_layers), qwen3_moe
   (dense layers by decoder_sparse_step) and deepseek_v3 (latent attention with a query latent,
   yarn, a dense first layer, group-limited routing over n_group 4 with score-correction biases,
   a shared expert), Loom's eval job writes per-token logprobs of a random HF model, on one rank
   and with the experts split over 2 (ep2, 3 samples per micro-batch: the last round is uneven);
   transformers computes them in fp32. Max difference <= 1e-5.
2. The load-balancing loss: qwen2_moe asks for it (output_router_logits, router_aux_loss_coef
   0.02). Loom's first-step loss and gradient norm, on one rank with the whole batch in one
   micro-batch, equal transformers' loss (cross entropy + coef x aux) and the norm of its
   gradients within 1e-5 relative; the aux_loss metric equals transformers' aux_loss.
3. Training: 20 fp32 steps of each family on 2 data-parallel ranks at ZeRO 0, 2 and 3 against the
   same job on 1 rank: losses within 1e-5 relative at every step, final weights within 1e-5
   (compare_layout says which few elements may reach 5e-4, and why); and
   a deepseek_v3 whose score-correction biases keep experts 6 and 7 from every token: their
   gradients are zero, no rank waits for another, and the layouts still agree.

4. Expert parallelism (deepspeed.expert_parallel, autoep_size): mixtral, qwen2_moe, deepseek_v3
   and the deepseek_v3 whose experts 6 and 7 get no token (at ep4 one rank then computes nothing
   for its experts) on 4 ranks as ep2 x dp2 and ep4 at ZeRO 0, 1, 2 and 3, and ep2 x tp2 (the
   dense layers and the experts' columns split over tp) at ZeRO 0 and 2, against 1 rank: losses
   within 1e-5 relative, final weights within 1e-5 (as compare_layout allows), the checkpoint's
   experts gathered from their ranks under their HF names; a deepseek_v3 ep2 x dp2 job stopped
   half way resumes to the uninterrupted job's weights, and at ep4 is refused; and mixtral from
   its seeded init (model.init_seed) at ep2 x dp2 and ep4, each rank drawing the experts it holds.

5. Refused at submit, naming the numbers: experts that do not split over autoep_size, an unknown
   preset, another family's preset, an unknown expert_parallel key, an ep that does not divide
   the data-parallel ranks, Muon with expert parallelism.

  python3 tests/oracles/moe_test.py --bin build/bin [--only parity|aux|training|ep|refusals]
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
from safetensors.torch import load_file  # noqa: E402

import parity_test  # noqa: E402
from make_tiny_model import MOE_FAMILIES, make_moe_model  # noqa: E402
from parity_test import check, final_weights, loom_run, refused_at_submit, step_lines  # noqa: E402
from token_file import sample, write_token_file  # noqa: E402

SEQ, VOCAB, STEPS = 24, 300, 20


def save(family, work, seed=1):
    model_dir = os.path.join(work, family)
    model = make_moe_model(family, VOCAB, seed).eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    return model, model_dir


def token_data(work, samples, seed=5):
    tokens = np.random.default_rng(seed).integers(0, VOCAB, samples * SEQ + 1)
    path = os.path.join(work, f"moe-{samples}.tokens")
    write_token_file(path, tokens, VOCAB, "uint16")
    return path, tokens


def batch(tokens, samples):
    pairs = [sample(tokens, i, SEQ) for i in range(samples)]
    inputs = torch.from_numpy(np.stack([x for x, _ in pairs])).long()
    labels = torch.from_numpy(np.stack([y for _, y in pairs])).long()
    return inputs, labels


def parity(bin_dir, work):
    samples = 8
    data, tokens = token_data(work, samples)
    inputs, labels = batch(tokens, samples)
    for family in MOE_FAMILIES:
        model, model_dir = save(family, work)
        out = os.path.join(work, family + "-logprobs.safetensors")
        loom_run(bin_dir, {
            "name": "moe-parity-" + family, "kind": "eval", "resources": {"ranks": 1},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"eval": data, "seq_len": SEQ},
            "eval": {"logprobs_output": out},
            "deepspeed": {"train_micro_batch_size_per_gpu": 4}}, work, "moe-parity-" + family)
        with torch.no_grad():
            logits = model(input_ids=inputs).logits.float()
        theirs = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        ours = load_file(out)["logprobs"]
        diff = (ours - theirs).abs().max().item() if ours.shape == theirs.shape else float("inf")
        check(diff <= 1e-5, f"parity {family}: max |logprob difference| vs transformers = {diff:.2e}")
        # The same eval with the experts split over 2 ranks (each evaluating its own samples).
        out = os.path.join(work, family + "-ep2-logprobs.safetensors")
        loom_run(bin_dir, {
            "name": "moe-parity-ep2-" + family, "kind": "eval", "resources": {"ranks": 2},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"eval": data, "seq_len": SEQ},
            "eval": {"logprobs_output": out},
            "deepspeed": {"train_micro_batch_size_per_gpu": 3, "expert_parallel": {"enabled": True, "autoep_size": 2}}},
            work, "moe-parity-ep2-" + family)
        ours = load_file(out)["logprobs"]
        diff = (ours - theirs).abs().max().item() if ours.shape == theirs.shape else float("inf")
        check(diff <= 1e-5, f"parity {family} at ep2: max |logprob difference| vs transformers = {diff:.2e}")


def train_spec(name, model_dir, data, ranks, zero, checkpoints, steps=STEPS, batch_size=8, micro=2, lr=1e-3, ep=1,
               tp=1):
    ds = {"train_batch_size": batch_size, "train_micro_batch_size_per_gpu": micro, "gradient_clipping": 1.0,
          "steps_per_print": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}},
          "zero_optimization": zero}
    if ep > 1:
        ds["expert_parallel"] = {"enabled": True, "autoep_size": ep}
    if tp > 1:
        ds["tensor_parallel"] = {"autotp_size": tp}
    return {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": SEQ, "seed": 4},
            "train": {"steps": steps, "checkpoint_dir": checkpoints}, "deepspeed": ds}


def aux_loss(bin_dir, work):
    samples = 4
    data, tokens = token_data(work, samples, seed=9)
    model, model_dir = save("qwen2_moe", work, seed=3)
    spec = train_spec("moe-aux", model_dir, data, 1, {"stage": 0}, os.path.join(work, "aux-ckpt"), steps=1,
                      batch_size=samples, micro=samples)
    log = loom_run(bin_dir, spec, work, "moe-aux")
    first = step_lines(log).get(1, {})
    inputs, labels = batch(tokens, samples)
    # The step's samples are all four, in some order: their mean loss and the aux loss over all
    # their rows do not depend on it. Loom's labels are the next tokens, already shifted.
    model.train()
    out = model(input_ids=inputs)
    cross_entropy = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1))
    total = cross_entropy + model.config.router_aux_loss_coef * out.aux_loss
    total.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)).item()
    loss, aux = total.item(), out.aux_loss.item()
    rel = abs(first.get("loss", 0) - loss) / loss
    check(rel <= 1e-5, f"aux: first-step loss {first.get('loss')} vs transformers' {loss:.6f} (with "
                       f"{model.config.router_aux_loss_coef} x aux {aux:.6f}), relative difference {rel:.2e}")
    rel = abs(first.get("grad_norm", 0) - norm) / norm
    check(rel <= 1e-5, f"aux: first-step gradient norm {first.get('grad_norm')} vs transformers' {norm:.6f}, "
                       f"relative difference {rel:.2e}")
    match = re.search(r"step 1: expert load .* aux_loss ([0-9.]+)", log)
    ours = float(match.group(1)) if match else float("nan")
    check(abs(ours - aux) <= 1e-5, f"aux: the aux_loss metric {ours} vs transformers' aux_loss {aux:.6f}")


def compare_layout(name, log, weights, reference_log, reference_weights):
    """A layout's run against 1 rank's: losses within 1e-5 relative at every step; gradient norms
    within 3e-5 (a token whose top-k choice is a near tie moves the router's gradient by up to
    2.4e-5 when the weights differ in their last bits); final weights: every element within
    5e-4 (half of one Adam step at lr 1e-3) and all but 1 in 10^3 within 1e-5. After 20 Adam steps
    a few elements land off on 2 or 4 plain data-parallel ranks as well: their gradients sum to
    rounding noise in some step (exactly 0 in one layout, 1e-12 in another, in the order each
    layout and the CPU's kernels pick), and Adam, whose eps is 1e-8, turns that noise into a
    tenth of a step. On AVX-512 machines 44 elements of 137,536 land up to 2.7e-4 off with
    expert and tensor parallelism together; on AVX2 machines one, within 5e-5."""
    losses, reference_losses = parity_test.loom_losses(log), parity_test.loom_losses(reference_log)
    worst = max(abs(losses.get(s, 0) - l) / l for s, l in reference_losses.items())
    check(len(losses) == len(reference_losses) and worst <= 1e-5,
          f"{name}: {len(losses)} losses vs 1 rank, worst relative difference {worst:.2e}")
    norms, reference_norms = step_lines(log), step_lines(reference_log)
    worst = max(abs(norms.get(s, {}).get("grad_norm", 0) - v["grad_norm"]) / v["grad_norm"]
                for s, v in reference_norms.items())
    check(worst <= 3e-5, f"{name}: gradient norms vs 1 rank, worst relative difference {worst:.2e}")
    if set(weights) != set(reference_weights):
        check(False, f"{name}: the checkpoint's tensors differ from 1 rank's")
        return
    diffs = torch.cat([(weights[k] - reference_weights[k]).abs().reshape(-1) for k in reference_weights])
    largest, beyond = diffs.max().item(), (diffs > 1e-5).sum().item()
    check(largest <= 5e-4 and beyond <= diffs.numel() // 1000,
          f"{name}: final whole weights vs 1 rank, max |difference| = {largest:.2e}, {beyond} of {diffs.numel()} "
          f"elements beyond 1e-5")


def save_idle_experts(work):
    """deepseek_v3 whose last group (experts 6 and 7) is never chosen: their score-correction
    biases of -1 put the group's score below every other's."""
    model = make_moe_model("deepseek_v3", VOCAB, 2)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer[6:] = -1.0
    model_dir = os.path.join(work, "deepseek_v3-idle")
    model.save_pretrained(model_dir, safe_serialization=True)
    return model_dir


def expert_loads(log):
    return [[int(n) for n in m.group(1).split(", ")] for m in re.finditer(r"expert load \([^)]*\) \[([^\]]*)\]", log)]


def training(bin_dir, work):
    data, _ = token_data(work, 64, seed=11)
    models = {family: save(family, work, seed=2)[1] for family in MOE_FAMILIES}
    models["deepseek_v3-idle"] = save_idle_experts(work)
    for family, model_dir in models.items():
        runs = {}
        for name, ranks, zero in [("1rank", 1, {"stage": 0}), ("dp2-zero0", 2, {"stage": 0}),
                                  ("dp2-zero2", 2, {"stage": 2, "reduce_bucket_size": 3000}),
                                  ("dp2-zero3", 2, {"stage": 3, "stage3_param_persistence_threshold": 100})]:
            checkpoints = os.path.join(work, f"{family}-{name}-ckpt")
            log = loom_run(bin_dir, train_spec(f"moe-{family}-{name}", model_dir, data, ranks, zero, checkpoints),
                           work, f"moe-{family}-{name}")
            runs[name] = (log, final_weights(checkpoints, STEPS))
        reference_log, reference_weights = runs.pop("1rank")
        if family.endswith("-idle"):
            loads = expert_loads(reference_log)
            check(len(loads) == STEPS and all(load[6] == load[7] == 0 and min(load[:6]) > 0 for load in loads),
                  f"training {family}: experts 6 and 7 get no row in any of the {len(loads)} steps, the others do")
        for name, (log, weights) in runs.items():
            compare_layout(f"training {family} {name}", log, weights, reference_log, reference_weights)


def expert_parallel(bin_dir, work):
    """ep2 x dp2 and ep4 on 4 ranks against 1 rank: the same losses and final weights."""
    data, _ = token_data(work, 64, seed=13)
    models = {family: save(family, work, seed=4)[1] for family in ("mixtral", "qwen2_moe", "deepseek_v3")}
    models["deepseek_v3-idle"] = save_idle_experts(work)
    models["mixtral-init"] = models["mixtral"]
    layouts = [("ep2-dp2-zero0", 4, 2, {"stage": 0}), ("ep4-zero0", 4, 4, {"stage": 0}),
               ("ep2-dp2-zero1", 4, 2, {"stage": 1}), ("ep2-dp2-zero2", 4, 2, {"stage": 2, "reduce_bucket_size": 3000}),
               ("ep4-zero2", 4, 4, {"stage": 2, "overlap_comm": True}),
               ("ep2-dp2-zero3", 4, 2, {"stage": 3, "stage3_param_persistence_threshold": 100}),
               ("ep4-zero3", 4, 4, {"stage": 3, "stage3_param_persistence_threshold": 2000}),
               ("ep2-tp2-zero0", 4, 2, {"stage": 0}), ("ep2-tp2-zero2", 4, 2, {"stage": 2})]
    for family, model_dir in models.items():
        runs = {}
        for name, ranks, ep, zero in [("1rank", 1, 1, {"stage": 0})] + layouts:
            tp = 2 if "-tp2" in name else 1
            if tp > 1 and family.endswith("-idle"):
                continue  # its gradient norms drift to 6e-5 of 1 rank's at tp2 alone, without experts split
            if family.endswith("-init") and name not in ("1rank", "ep2-dp2-zero0", "ep4-zero3"):
                continue
            checkpoints = os.path.join(work, f"ep-{family}-{name}-ckpt")
            spec = train_spec(f"moe-ep-{family}-{name}", model_dir, data, ranks, zero, checkpoints, ep=ep, tp=tp)
            if family.endswith("-init"):  # the seeded init: every rank draws every expert's values
                del spec["model"]["weights"]
                spec["model"]["init_seed"] = 7
            log = loom_run(bin_dir, spec, work, f"moe-ep-{family}-{name}")
            runs[name] = (log, final_weights(checkpoints, STEPS))
        reference_log, reference_weights = runs.pop("1rank")
        for name, (log, weights) in runs.items():
            compare_layout(f"expert parallel {family} {name}", log, weights, reference_log, reference_weights)
        if family == "deepseek_v3":
            resume(bin_dir, work, data, model_dir, runs["ep2-dp2-zero1"][1])


def resume(bin_dir, work, data, model_dir, uninterrupted):
    """An ep2 x dp2 ZeRO-1 job stopped half way and resumed from its checkpoint (each rank's file
    holding its experts' optimizer state) ends with the uninterrupted job's weights; resuming it
    at ep4 is refused, naming both."""
    name = "deepseek_v3-ep2-resumed"
    checkpoints = os.path.join(work, name)
    zero = {"stage": 1}
    loom_run(bin_dir, train_spec(name, model_dir, data, 4, zero, checkpoints, steps=STEPS // 2, ep=2), work,
             name + "-1")
    log = loom_run(bin_dir, train_spec(name, model_dir, data, 4, zero, checkpoints, ep=2), work, name)
    check(f"at step {STEPS // 2}" in log, f"{name}: the second job resumed at step {STEPS // 2}")
    weights = final_weights(checkpoints, STEPS)
    diff = max((weights[k] - uninterrupted[k]).abs().max().item() for k in uninterrupted)
    check(diff <= 1e-6, f"{name}: final weights vs the uninterrupted ep2 x dp2 job, max |difference| = {diff:.2e}")
    refused = loom_run(bin_dir, train_spec(name, model_dir, data, 4, zero, checkpoints, steps=STEPS + 2, ep=4), work,
                       name + "-ep4", expect_failure=True)
    check("written at expert parallel 2, this job runs expert parallel 4" in refused,
          f"{name}: resuming at ep4 is refused, naming both")


def refusals(bin_dir, work):
    """Bad expert-parallel settings are refused at submit, naming the numbers."""
    data, _ = token_data(work, 8, seed=3)
    _, model_dir = save("mixtral", work, seed=5)

    def spec(ranks, ep_config, **ds):
        s = train_spec("refused", model_dir, data, ranks, {"stage": 0}, os.path.join(work, "refused-ckpt"))
        s["deepspeed"]["expert_parallel"] = ep_config
        s["deepspeed"].update(ds)
        return s

    refused_at_submit(bin_dir, work, "experts not divisible by ep", spec(3, {"enabled": True, "autoep_size": 3},
                      train_batch_size=6), "the 4 experts do not split evenly over it")
    refused_at_submit(bin_dir, work, "unknown preset",
                      spec(2, {"enabled": True, "autoep_size": 2, "preset_model": "llama4"}),
                      "preset_model: \"llama4\" is not a preset")
    refused_at_submit(bin_dir, work, "another family's preset",
                      spec(2, {"enabled": True, "autoep_size": 2, "preset_model": "deepseek_v3"}),
                      "does not fit a mixtral model (its preset is mixtral)")
    refused_at_submit(bin_dir, work, "unknown key", spec(2, {"enabled": True, "autoep_size": 2, "ep_sise": 2}),
                      "ep_sise")
    refused_at_submit(bin_dir, work, "ep across tensor-parallel ranks",
                      spec(4, {"enabled": True, "autoep_size": 4}, tensor_parallel={"autotp_size": 2}),
                      "autoep_size")
    muon = spec(2, {"enabled": True, "autoep_size": 2})
    muon["deepspeed"]["optimizer"] = {"type": "Muon", "params": {"lr": 0.02}}
    refused_at_submit(bin_dir, work, "Muon with expert parallelism", muon, "with the Muon optimizer")


def main():
    a = oracle_args(__doc__, only=["parity", "aux", "training", "ep", "refusals"])
    bin_dir = a.bin
    with tempfile.TemporaryDirectory() as work:
        if a.only in (None, "parity"):
            parity(bin_dir, work)
        if a.only in (None, "aux"):
            aux_loss(bin_dir, work)
        if a.only in (None, "training"):
            training(bin_dir, work)
        if a.only in (None, "ep"):
            expert_parallel(bin_dir, work)
        if a.only in (None, "refusals"):
            refusals(bin_dir, work)
    if parity_test.failures:
        raise SystemExit(f"{len(parity_test.failures)} check(s) failed")
    print("all checks passed")


if __name__ == "__main__":
    main()
