"""Resharding Loom checkpoints to other layouts (`kind: convert`, `to: loom`), end to end through
`loomctl run` (a real loomd, real ranks):

1. A tiny llama trains 4 steps under each source layout (ZeRO 1, 2, 3 on 4 ranks, tensor parallel
   2 x data parallel 2, sequence parallel 2 x data parallel 2, stage 0 on 1 rank; AdamW, Muon at
   stage 2, and ZeRO 3 with frozen parameters) and checkpoints. A convert
   job rewrites each checkpoint for another layout (1, 2 and 3 ranks, other stages, tensor
   parallelism on and off), and a job of that layout resumes from it for 4 more steps. Its losses
   equal the uninterrupted run's within 1e-5 at every step, and its final weights within 1e-5
   (Muon's within 1e-4: across layouts its updates differ by that much uninterrupted too).
   A mixtral's checkpoints at ep2 x dp2 (ZeRO 1), ep4 (ZeRO 3) and 2 ranks without expert
   parallelism (ZeRO 2) go to other expert-parallel sizes and stages the same way.
2. Two convert ranks split the files and write the same checkpoint; a Loom checkpoint converts to
   HF safetensors whose tensors are its fp32 masters.
3. Refusals: a layout the batch does not split over (naming the field), a DeepSpeed checkpoint to
   loom, a state tensor missing from a rank file (naming the file and the tensor), and a train
   job resuming on another layout (naming the convert job to run).

  python3 tests/oracles/reshard_test.py --bin build/bin
"""
import json
import os
import shutil
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import moe_test  # noqa: E402
import parity_test  # noqa: E402
from parity_test import check, loom_losses, loom_run  # noqa: E402

SEQ, STEPS = 16, 8
HALF = STEPS // 2
ADAMW = {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}}
# The embedding and the first layer's MLP: no gradient, no optimizer state; stage 3 partitions
# their weights all the same.
FROZEN = ("model\\.embed_tokens\\.weight", "model\\.layers\\.0\\.mlp\\..*")
# Where oneDNN has fp16 (AVX512-FP16, AMX) Muon's gram iteration runs in fp16, as DeepSpeed's
# does, and spreads the ranks' other summation orders into the weights: on such a Xeon,
# uninterrupted Muon runs on 4 ranks at ZeRO 2, 3 ranks at ZeRO 3 and tp2 end 2.8e-5 to 3.9e-5
# from the 1-rank run, without any reshard (muon_test.py's layouts, the same).
WEIGHT_TOLERANCE = {"muon": 1e-4}
MUON = {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 2e-3, "momentum": 0.9, "weight_decay": 0.01, "torch_adam": True}}


def train_spec(data, model_dir, name, ranks, zero, checkpoints, steps, tp=1, optimizer=ADAMW, sp=1, frozen=(), ep=1):
    # 12 samples a step split over 1, 2, 3 and 4 data-parallel ranks.
    deepspeed = {"train_batch_size": 12, "gradient_clipping": 1.0, "steps_per_print": 1,
                 "optimizer": optimizer, "zero_optimization": dict({"stage": zero},
                                                                    **({"stage3_param_persistence_threshold": 100}
                                                                       if zero == 3 else {}))}
    if tp > 1:
        deepspeed["tensor_parallel"] = {"autotp_size": tp}
    if sp > 1:
        deepspeed["sequence_parallel_size"] = sp
    if ep > 1:
        deepspeed["expert_parallel"] = {"enabled": True, "autoep_size": ep}
    return {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": SEQ, "seed": 2},
            "train": dict({"steps": steps, "checkpoint_dir": checkpoints},
                          **({"frozen_parameters": list(frozen)} if frozen else {})),
            "deepspeed": deepspeed}


def convert_spec(name, source, output, layout, convert_ranks=1):
    return {"name": name, "kind": "convert", "resources": {"ranks": convert_ranks},
            "convert": {"from": source, "to": "loom", "output": output, "layout": layout}}


def rewrite_manifest(tag_dir):
    """The manifest a checkpoint writer would have written over the files as they are now."""
    files = {}
    for name in sorted(os.listdir(tag_dir)):
        if name != "manifest.json":
            data = open(os.path.join(tag_dir, name), "rb").read()
            files[name] = {"bytes": len(data), "crc32": zlib.crc32(data)}
    with open(os.path.join(tag_dir, "manifest.json"), "w") as f:
        json.dump({"tag": os.path.basename(tag_dir), "files": files}, f)


def final_weights(checkpoints):
    return load_file(os.path.join(checkpoints, f"global_step{STEPS}", "model.safetensors"))


def check_resumed(name, output, log, reference_losses):
    """The job resumed from `output` half way, and its losses from there equal the uninterrupted
    run's within 1e-5."""
    check(f"resumed from {output}/global_step{HALF} at step {HALF}" in log, f"{name}: resumed at step {HALF}")
    losses = loom_losses(log)
    worst = max(abs(losses.get(s, 0) - reference_losses[s]) / reference_losses[s] for s in range(HALF + 1, STEPS + 1))
    check(len(losses) == STEPS - HALF and worst <= 1e-5,
          f"{name}: {len(losses)} resumed losses vs the uninterrupted run, worst relative difference {worst:.2e}")


def expert_parallel(run, data, work):
    """A mixtral's checkpoints under expert parallelism (each rank's file holding its own experts'
    state) resharded to and from other expert-parallel sizes and stages, and resumed there: the
    losses of the uninterrupted 1-rank run within 1e-5, final weights within 5e-5 and all but 1 in
    10^4 elements within 1e-5 (moe_test.compare_layout says why)."""
    _, model_dir = moe_test.save("mixtral", work, seed=9)
    checkpoints = os.path.join(work, "moe-reference")
    log = run(train_spec(data, model_dir, "moe-reference", 1, 0, checkpoints, STEPS))
    reference_losses, reference_weights = loom_losses(log), final_weights(checkpoints)
    # (source layout) -> [(target layout)], each (ranks, zero stage, ep).
    cases = [
        ("moe-ep2-dp2-zero1", (4, 1, 2), [(1, 0, 1), (4, 3, 4)]),
        ("moe-ep4-zero3", (4, 3, 4), [(2, 2, 2), (3, 1, 1)]),
        ("moe-zero2-2ranks", (2, 2, 1), [(4, 0, 2)]),
    ]
    for source_name, (ranks, zero, ep), targets in cases:
        source = os.path.join(work, source_name)
        run(train_spec(data, model_dir, source_name, ranks, zero, source, HALF, ep=ep))
        for target_ranks, target_zero, target_ep in targets:
            target_name = f"{source_name}-to-{target_ranks}ranks-zero{target_zero}-ep{target_ep}"
            output = os.path.join(work, target_name)
            layout = {"ranks": target_ranks, "zero_stage": target_zero, "autoep_size": target_ep}
            if target_zero == 3:
                layout["stage3_param_persistence_threshold"] = 100
            run(convert_spec(target_name + "-convert", source, output, layout))
            log = run(train_spec(data, model_dir, target_name, target_ranks, target_zero, output, STEPS, ep=target_ep))
            check_resumed(target_name, output, log, reference_losses)
            weights = final_weights(output)
            diffs = torch.cat([(weights[k] - reference_weights[k]).abs().reshape(-1) for k in reference_weights])
            largest, beyond = diffs.max().item(), (diffs > 1e-5).sum().item()
            check(largest <= 5e-5 and beyond <= diffs.numel() // 10000,
                  f"{target_name}: final weights vs the uninterrupted run, max |difference| = {largest:.2e}, "
                  f"{beyond} of {diffs.numel()} elements beyond 1e-5")


def main():
    bin_dir = oracle_args(__doc__).bin
    work = tempfile.mkdtemp(prefix="loom-reshard-")
    try:
        data, model_dir = parity_test.licence_tokens_and_model(bin_dir, work, "reshard", seed=8)

        def run(spec, expect_failure=False):
            return loom_run(bin_dir, spec, work, spec["name"], expect_failure=expect_failure)

        # The uninterrupted runs every resumed one is measured against: AdamW, Muon, and AdamW with
        # parameters frozen.
        settings = {"adamw": (ADAMW, ()), "muon": (MUON, ()), "frozen": (ADAMW, FROZEN)}
        references = {}
        for setting, (optimizer, frozen) in settings.items():
            checkpoints = os.path.join(work, "reference-" + setting)
            log = run(train_spec(data, model_dir, "reference-" + setting, 1, 0, checkpoints, STEPS,
                                 optimizer=optimizer, frozen=frozen))
            references[setting] = (loom_losses(log), final_weights(checkpoints))

        # (source layout) -> [(target layout)], each layout (ranks, zero stage, tp); sp splits the
        # sequence of the sp x dp ranks that ZeRO partitions over.
        cases = [
            ("zero1-4ranks", (4, 1, 1), "adamw", [(3, 1, 1), (1, 3, 1)]),
            ("zero2-4ranks", (4, 2, 1), "adamw", [(1, 0, 1), (2, 2, 2)]),
            ("zero3-4ranks", (4, 3, 1), "adamw", [(2, 1, 1), (3, 3, 1)]),
            ("tp2-dp2-zero1", (4, 1, 2), "adamw", [(1, 0, 1), (3, 2, 1)]),
            ("zero0-1rank", (1, 0, 1), "adamw", [(4, 3, 1)]),
            ("muon-zero2-4ranks", (4, 2, 1), "muon", [(3, 3, 1), (2, 0, 2)]),
            ("sp2-dp2-zero2", (4, 2, 1, 2), "adamw", [(2, 3, 1)]),
            ("frozen-zero3-4ranks", (4, 3, 1), "frozen", [(3, 1, 1), (1, 0, 1)]),
        ]
        for source_name, (ranks, zero, tp, *sp), setting, targets in cases:
            optimizer, frozen = settings[setting]
            reference_losses, reference_weights = references[setting]
            source = os.path.join(work, source_name)
            run(train_spec(data, model_dir, source_name, ranks, zero, source, HALF, tp=tp, optimizer=optimizer,
                           sp=sp[0] if sp else 1, frozen=frozen))
            for target_ranks, target_zero, target_tp in targets:
                target_name = f"{source_name}-to-{target_ranks}ranks-zero{target_zero}-tp{target_tp}"
                output = os.path.join(work, target_name)
                layout = {"ranks": target_ranks, "zero_stage": target_zero, "autotp_size": target_tp}
                if target_zero == 3:
                    layout["stage3_param_persistence_threshold"] = 100  # the resuming job's (train_spec)
                log = run(convert_spec(target_name + "-convert", source, output, layout))
                check(f"resumes from it with train.checkpoint_dir {output}" in log,
                      f"{target_name}: the convert job says where to point train.checkpoint_dir")
                log = run(train_spec(data, model_dir, target_name, target_ranks, target_zero, output, STEPS,
                                     tp=target_tp, optimizer=optimizer, frozen=frozen))
                check_resumed(target_name, output, log, reference_losses)
                weights = final_weights(output)
                diff = max((weights[k] - reference_weights[k]).abs().max().item() for k in reference_weights)
                tolerance = WEIGHT_TOLERANCE.get(setting, 1e-5)
                check(diff <= tolerance, f"{target_name}: final weights vs the uninterrupted run, max |difference| = "
                      f"{diff:.2e} (within {tolerance:g})")

        expert_parallel(run, data, work)

        # The control: the same resumption with Adam's moments zeroed (the masters kept) does not
        # give those losses, so the comparisons above see the optimizer state.
        zeroed = os.path.join(work, "zeroed-moments")
        shutil.copytree(os.path.join(work, "zero1-4ranks-to-3ranks-zero1-tp1"), zeroed)
        shutil.rmtree(os.path.join(zeroed, f"global_step{STEPS}"))
        with open(os.path.join(zeroed, "latest"), "w") as f:
            f.write(f"global_step{HALF}\n")
        for r in range(3):
            rank_file = os.path.join(zeroed, f"global_step{HALF}", f"rank_{r:05d}.safetensors")
            tensors = load_file(rank_file)
            tensors = {k: torch.zeros_like(v) if k.startswith("partition.") else v for k, v in tensors.items()}
            save_file(tensors, rank_file)
        rewrite_manifest(os.path.join(zeroed, f"global_step{HALF}"))
        losses = loom_losses(run(train_spec(data, model_dir, "zeroed-moments", 3, 1, zeroed, STEPS)))
        worst = max(abs(losses[s] - references["adamw"][0][s]) / references["adamw"][0][s] for s in losses)
        check(worst > 1e-4, f"control: with the moments zeroed the resumed losses differ by {worst:.2e}")

        # Two convert ranks write the checkpoint one writes, file for file.
        source = os.path.join(work, "zero3-4ranks")
        one, two = os.path.join(work, "one-rank-convert"), os.path.join(work, "two-rank-convert")
        run(convert_spec("one-rank-convert", source, one, {"ranks": 3, "zero_stage": 2}))
        run(convert_spec("two-rank-convert", source, two, {"ranks": 3, "zero_stage": 2}, convert_ranks=2))
        tag = f"global_step{HALF}"
        names = sorted(os.listdir(os.path.join(one, tag)))
        same = names == sorted(os.listdir(os.path.join(two, tag))) and all(
            open(os.path.join(one, tag, n), "rb").read() == open(os.path.join(two, tag, n), "rb").read()
            for n in names if n != "trainer_state.json")
        check(same and len(names) == 8, f"2 convert ranks write the same {len(names)} files as 1")

        # To HF: the fp32 masters, which in fp32 training are the weights themselves.
        hf = os.path.join(work, "zero3-hf")
        run({"name": "zero3-hf", "kind": "convert", "resources": {"ranks": 1},
             "convert": {"from": source, "to": "hf", "output": hf}})
        theirs, ours = load_file(os.path.join(source, tag, "model.safetensors")), load_file(hf + "/model.safetensors")
        check(set(theirs) == set(ours) and all(torch.equal(theirs[k], ours[k]) for k in theirs),
              f"a Loom checkpoint to hf: its {len(ours)} tensors equal the checkpoint's weights")

        # Refusals.
        refused = run(convert_spec("five-ranks", source, os.path.join(work, "five"), {"ranks": 5}),
                      expect_failure=True)
        check("convert.layout" in refused and "train_batch_size: 12 is not divisible" in refused,
              "a layout the batch does not split over is refused, naming the field")
        missing = os.path.join(work, "no-such-checkpoint")
        refused = run(convert_spec("missing", missing, os.path.join(work, "missing-out"), {"ranks": 2}),
                      expect_failure=True)
        check(f"convert.from: {missing} does not exist" in refused, "a `from` that does not exist is refused, naming it")
        broken = os.path.join(work, "broken")
        shutil.copytree(source, broken)
        rank_file = os.path.join(broken, tag, "rank_00002.safetensors")
        tensors = load_file(rank_file)
        del tensors["master.model.layers.0.mlp.up_proj.weight"]
        save_file(tensors, rank_file)
        rewrite_manifest(os.path.join(broken, tag))
        refused = run(convert_spec("broken", broken, os.path.join(work, "broken-out"), {"ranks": 2}),
                      expect_failure=True)
        check("rank_00002.safetensors: has no master.model.layers.0.mlp.up_proj.weight" in refused,
              "a state tensor missing from a rank file is refused, naming the file and the tensor")
        check(not os.path.exists(os.path.join(work, "broken-out")), "and nothing is written")
        resumed = run(train_spec(data, model_dir, "other-layout", 2, 1, source, STEPS), expect_failure=True)
        check('"kind":"convert"' in resumed and '"layout":{"autotp_size":1,"ranks":2,' in resumed,
              "a train job on another layout is refused, naming the convert job that rewrites the checkpoint")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("reshard: all checks passed")


if __name__ == "__main__":
    main()
