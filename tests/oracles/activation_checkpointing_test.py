"""Activation checkpointing and AutoEP's expert MLP options, end to end through `loomctl run`
(real loomd, real CPU ranks over UCX):

1. Checkpointed training equals plain training: a llama trained 20 fp32 steps with
   deepspeed.activation_checkpointing (every decoder layer recomputed in backward) on 1 rank
   (with cpu_checkpointing and number_checkpoints 1), 2 data-parallel ranks at ZeRO 0, 2 and 3, and
   tensor parallel 2 x dp 2, and with train.gradient_checkpointing (HF's switch), against the plain
   job on 1 rank: losses within 1e-5 relative, gradient norms and final weights within 1e-5; and
   with the embedding and the first layer frozen at ZeRO 3 against 1 rank frozen alike.
2. MoE under checkpointing replays its routing: qwen2_moe (load-balancing loss, shared expert) at
   ep2 x dp2 (ZeRO 0 and 3) and ep2 x tp2 (ZeRO 2), and mixtral at ep2 x dp2 (ZeRO 0), ep2 x tp2
   (ZeRO 2) and ep2 x sp2 (Ulysses, ZeRO 1), checkpointed, against the plain job on 1 rank; the aux loss keeps its gradient through the checkpoint (losses and norms agree), the
   experts' load is counted once, and the comms logger shows that the recomputation exchanged the
   rows again (all_to_all_v 1.5x the plain run's: forward, recompute, backward) but never the
   per-expert counts (all_to_all as many as the plain run's): the dispatch layout was replayed,
   not routed again.
3. expert_parallel.expert_activation and gate_up_impl: a mixtral's eval logprobs with each of
   DeepSpeed 0.19.8's expert activations (swiglu, geglu_tanh, swiglu_clamped, swiglu_oai), gate and
   up fused, equal transformers' mixtral whose experts apply DeepSpeed's own activation function
   (deepspeed.moe.ep_experts) within 1e-5.
4. Refused at submit, naming the key: partition_activations true, an unknown
   activation_checkpointing key, number_checkpoints 0, an unknown expert_activation, gate_up_impl
   fused without grouped GEMMs.

  python3 tests/oracles/activation_checkpointing_test.py --bin build/bin [--only dense|moe|activations|refusals]
"""
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import moe_test  # noqa: E402
import parity_test  # noqa: E402
from parity_test import check, final_weights, loom_run, refused_at_submit  # noqa: E402

STEPS = 20


def dense(bin_dir, work):
    data, _ = moe_test.token_data(work, 64, seed=21)
    model_dir = os.path.join(work, "llama")
    parity_test.save_model("llama", model_dir, seed=3)
    runs = {}
    layouts = [("1rank", 1, 1, {"stage": 0}, None),
               ("1rank-ac-host-first", 1, 1, {"stage": 0}, {"cpu_checkpointing": True, "number_checkpoints": 1}),
               ("1rank-gradient-checkpointing", 1, 1, {"stage": 0}, "train"),
               ("dp2-zero0-ac", 2, 1, {"stage": 0}, {}),
               ("dp2-zero2-ac", 2, 1, {"stage": 2, "reduce_bucket_size": 3000}, {}),
               ("dp2-zero3-ac", 2, 1, {"stage": 3, "stage3_param_persistence_threshold": 100}, {}),
               ("tp2-dp2-zero1-ac", 4, 2, {"stage": 1}, {})]
    for name, ranks, tp, zero, checkpointing in layouts:
        checkpoints = os.path.join(work, f"dense-{name}-ckpt")
        spec = moe_test.train_spec(f"ac-dense-{name}", model_dir, data, ranks, zero, checkpoints, tp=tp)
        if checkpointing == "train":
            spec["train"]["gradient_checkpointing"] = True
        elif checkpointing is not None:
            spec["deepspeed"]["activation_checkpointing"] = checkpointing
        runs[name] = (loom_run(bin_dir, spec, work, f"ac-dense-{name}"), final_weights(checkpoints, STEPS))
    reference_log, reference_weights = runs.pop("1rank")
    for name, (log, weights) in runs.items():
        parity_test.compare_with_one_rank(f"dense {name}", log, weights, reference_log, reference_weights)
    # The embedding and the first layer frozen: that layer has nothing to recompute for (no
    # gradient comes in, none goes to its weights), and ZeRO 3 still releases it.
    frozen = {}
    for name, ranks, checkpointing in [("1rank-frozen", 1, None), ("dp2-zero3-ac-frozen", 2, {})]:
        checkpoints = os.path.join(work, f"dense-{name}-ckpt")
        zero = {"stage": 3, "stage3_param_persistence_threshold": 100} if ranks > 1 else {"stage": 0}
        spec = moe_test.train_spec(f"ac-dense-{name}", model_dir, data, ranks, zero, checkpoints)
        spec["train"]["frozen_parameters"] = ["model\\.embed_tokens\\.weight", "model\\.layers\\.0\\..*"]
        if checkpointing is not None:
            spec["deepspeed"]["activation_checkpointing"] = checkpointing
        frozen[name] = (loom_run(bin_dir, spec, work, f"ac-dense-{name}"), final_weights(checkpoints, STEPS))
    parity_test.compare_with_one_rank("dense dp2-zero3-ac-frozen (embedding and layer 0 frozen)",
                                      *frozen["dp2-zero3-ac-frozen"], *frozen["1rank-frozen"])


def comm_counts(log):
    """{op: count} from the comms logger's summary in rank 0's log."""
    counts = {}
    summary = log.split("# comms logger", 1)[-1] if "# comms logger" in log else ""
    for op in ("all_to_all_v", "all_to_all"):
        found = re.findall(rf"^{op}\s+[\d.]+ \w+\s+(\d+)\s", summary, re.M)
        counts[op] = sum(int(n) for n in found)
    return counts


def moe(bin_dir, work):
    data, _ = moe_test.token_data(work, 64, seed=23)
    for family in ("qwen2_moe", "mixtral"):
        _, model_dir = moe_test.save(family, work, seed=5)
        runs = {}
        layouts = [("1rank", 1, 1, 1, {"stage": 0}, False),
                   ("ep2-dp2-zero0", 4, 2, 1, {"stage": 0}, False),
                   ("ep2-dp2-zero0-ac", 4, 2, 1, {"stage": 0}, True),
                   ("ep2-dp2-zero3-ac", 4, 2, 1, {"stage": 3, "stage3_param_persistence_threshold": 100}, True),
                   ("ep2-tp2-zero2-ac", 4, 2, 2, {"stage": 2}, True),
                   ("ep2-sp2-zero1-ac", 4, 2, 1, {"stage": 1}, True)]
        for name, ranks, ep, tp, zero, checkpointed in layouts:
            skipped = ("ep2-dp2-zero0", "ep2-dp2-zero3-ac") if family == "mixtral" else ("ep2-sp2-zero1-ac",)
            if name in skipped:
                continue
            checkpoints = os.path.join(work, f"moe-{family}-{name}-ckpt")
            spec = moe_test.train_spec(f"ac-{family}-{name}", model_dir, data, ranks, zero, checkpoints, ep=ep, tp=tp)
            spec["deepspeed"]["comms_logger"] = {"enabled": True}
            if "-sp2" in name:
                spec["deepspeed"]["sequence_parallel_size"] = 2
            if checkpointed:
                spec["deepspeed"]["activation_checkpointing"] = {}
            runs[name] = (loom_run(bin_dir, spec, work, f"ac-{family}-{name}"), final_weights(checkpoints, STEPS))
        reference_log, reference_weights = runs.pop("1rank")
        for name, (log, weights) in runs.items():
            if name.endswith("-ac"):
                moe_test.compare_layout(f"moe {family} {name}", log, weights, reference_log, reference_weights)
                check(moe_test.expert_loads(log) == moe_test.expert_loads(reference_log),
                      f"moe {family} {name}: the experts' load per step equals 1 rank's (counted once)")
        if "ep2-dp2-zero0" in runs:
            plain, replayed = comm_counts(runs["ep2-dp2-zero0"][0]), comm_counts(runs["ep2-dp2-zero0-ac"][0])
            check(plain["all_to_all"] > 0 and replayed["all_to_all"] == plain["all_to_all"] and
                  2 * replayed["all_to_all_v"] == 3 * plain["all_to_all_v"],
                  f"moe {family}: checkpointed ep2 x dp2 exchanged counts {replayed['all_to_all']} times (plain "
                  f"{plain['all_to_all']}) and rows {replayed['all_to_all_v']} times (plain {plain['all_to_all_v']}): "
                  f"the recomputation replayed the dispatch")


def hf_with_activation(model, name):
    """transformers' mixtral with its experts' `act_fn(gate) * up` replaced by DeepSpeed's
    expert activation `name` (its preset defaults: alpha 1.702, limit 7)."""
    from deepspeed.moe.ep_experts import get_expert_activation
    activation = get_expert_activation(name).fn

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            token, slot = torch.where(top_k_index == e)
            if token.numel() == 0:
                continue
            gate, up = torch.nn.functional.linear(hidden_states[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            h = torch.nn.functional.linear(activation(gate, up, 1.702, 7.0), self.down_proj[e])
            out.index_add_(0, token, h * top_k_weights[token, slot, None])
        return out

    for layer in model.model.layers:
        experts = layer.mlp.experts
        experts.forward = forward.__get__(experts)
    return model


def activations(bin_dir, work):
    samples = 4
    data, tokens = moe_test.token_data(work, samples, seed=25)
    inputs, labels = moe_test.batch(tokens, samples)
    model, model_dir = moe_test.save("mixtral", work, seed=6)
    # Scaled up, so that the clamps at 7 are reached.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(40.0)
    model.save_pretrained(model_dir, safe_serialization=True)
    for name in ("swiglu", "geglu_tanh", "swiglu_clamped", "swiglu_oai"):
        out = os.path.join(work, f"activation-{name}.safetensors")
        loom_run(bin_dir, {
            "name": f"ac-activation-{name}", "kind": "eval", "resources": {"ranks": 1},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"eval": data, "seq_len": moe_test.SEQ},
            "eval": {"logprobs_output": out},
            "deepspeed": {"train_micro_batch_size_per_gpu": samples,
                          "expert_parallel": {"enabled": True, "autoep_size": 1, "expert_activation": name,
                                              "gate_up_impl": "fused"}}}, work, f"ac-activation-{name}")
        with torch.no_grad():
            reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            logits = hf_with_activation(reference, name)(input_ids=inputs).logits.float()
        theirs = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        ours = load_file(out)["logprobs"]
        diff = (ours - theirs).abs().max().item() if ours.shape == theirs.shape else float("inf")
        check(diff <= 1e-5, f"expert_activation {name}, gate_up_impl fused: max |logprob difference| vs transformers "
                            f"with DeepSpeed's activation = {diff:.2e}")


def refusals(bin_dir, work):
    data, _ = moe_test.token_data(work, 8, seed=27)
    _, model_dir = moe_test.save("mixtral", work, seed=7)

    def spec_with(section, value):
        spec = moe_test.train_spec("ac-refused", model_dir, data, 1, {"stage": 0}, os.path.join(work, "refused"))
        spec["deepspeed"][section] = value
        return spec

    cases = [
        ("partition", spec_with("activation_checkpointing", {"partition_activations": True}),
         "deepspeed.activation_checkpointing.partition_activations: true is not supported"),
        ("unknown", spec_with("activation_checkpointing", {"checkpoint_in_cpu": True}),
         "deepspeed.activation_checkpointing.checkpoint_in_cpu"),
        ("zero-checkpoints", spec_with("activation_checkpointing", {"number_checkpoints": 0}),
         "deepspeed.activation_checkpointing.number_checkpoints"),
        ("activation", spec_with("expert_parallel", {"enabled": True, "expert_activation": "relu2"}),
         "deepspeed.expert_parallel.expert_activation: \"relu2\" is not one of"),
        ("fused-loop", spec_with("expert_parallel", {"enabled": True, "use_grouped_mm": False, "gate_up_impl": "fused"}),
         "deepspeed.expert_parallel.gate_up_impl: \"fused\" runs gate and up as one grouped GEMM"),
    ]
    for name, spec, expected in cases:
        refused_at_submit(bin_dir, work, f"ac-refused-{name}", spec, expected)


def main():
    a = oracle_args(__doc__, only=["dense", "moe", "activations", "refusals"])
    bin_dir = a.bin
    with tempfile.TemporaryDirectory() as work:
        for name, part in [("dense", dense), ("moe", moe), ("activations", activations), ("refusals", refusals)]:
            if a.only in (None, name):
                part(bin_dir, work)
    return parity_test.exit_code()


if __name__ == "__main__":
    sys.exit(main())
