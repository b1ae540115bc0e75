"""RL post-training end to end on CPU (`loomd --standalone` on loopback): `loomctl rl` alternates a
served rollout job, which stays up, with train jobs, and the model learns a rule-rewarded task.

The task: after each prompt's marker token, answer with one fixed token (reference [TARGET],
rule exact_match). A random llama with a vocabulary of 16 answers it at chance (1/16) at first;
each iteration samples 8 answers per prompt from the served job, scores them, trains 2
policy-gradient steps (GRPO advantages, PPO clipping) from the last iteration's checkpoint, and
loads the new weights into the rollout job. Checked: the mean reward rises from at most 0.25 to at
least 0.8 within 6 iterations; iteration i's samples come from weights version i - 1 and its update
loads version i; every train job is a job like any other (succeeded, with its loss); afterwards
the served job answers greedily with the target at the version of the last update. A user's
scorer (a Python script run by loomctl, never inside a rank) scores instead of the rule; a scorer
that fails stops the loop naming its log; bad loop files are refused naming the field.

  python3 tests/oracles/rl_loop_test.py --bin build/bin
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

from make_tiny_model import make_config  # noqa: E402
from parity_test import ControlPlane, check, exit_code  # noqa: E402

VOCAB, MARKER, TARGET, ITERATIONS = 16, 3, 11, 6


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)
    return path


def main():
    bin_dir = oracle_args(__doc__).bin
    with tempfile.TemporaryDirectory(prefix="loom-rl-") as work:
        torch.manual_seed(3)
        model_dir = os.path.join(work, "llama")
        transformers.AutoModelForCausalLM.from_config(make_config("llama", VOCAB, False, False),
                                                      dtype=torch.float32).save_pretrained(model_dir)
        g = torch.Generator().manual_seed(5)
        prompts = os.path.join(work, "prompts.jsonl")
        with open(prompts, "w") as f:
            for i in range(8):
                body = torch.randint(0, VOCAB, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
                f.write(json.dumps({"id": f"q{i}", "prompt_token_ids": body + [MARKER], "reference": [TARGET]}) + "\n")
        train = write_json(os.path.join(work, "train.json"), {
            "name": "rl-train", "kind": "train", "resources": {"ranks": 1},
            "model": {"config": os.path.join(model_dir, "config.json"), "weights": model_dir},
            "data": {"seq_len": 16, "reward": {"rule": "exact_match"}},
            "train": {"steps": 2, "loss": {"type": "policy_gradient", "advantage": "grpo"}},
            "deepspeed": {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16, "steps_per_print": 1,
                          "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.0}}}})

        plane = ControlPlane(bin_dir, work)
        try:
            job = plane.submit({"name": "policy", "kind": "rollout", "resources": {"ranks": 1},
                                "model": {"config": os.path.join(model_dir, "config.json"), "weights": model_dir},
                                "rollout": {"serve": True, "max_num_seqs": 64, "seed": 1}})
            loop = write_json(os.path.join(work, "loop.json"), {
                "name": "rl", "rollout_job": job, "prompts": prompts, "train": train, "iterations": ITERATIONS,
                "sampling": {"n": 8, "max_tokens": 1, "temperature": 1.0}, "work_dir": os.path.join(work, "run")})
            r = plane.ctl("rl", loop, "-o", "json", timeout=900)
            check(r.returncode == 0, f"loomctl rl runs {ITERATIONS} iterations {r.stderr.strip()[-500:]}")
            iterations = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
            rewards = [it.get("reward_mean", -1) for it in iterations]
            print("mean reward per iteration:", " ".join(f"{x:.3f}" for x in rewards))
            check(len(iterations) == ITERATIONS and rewards[0] <= 0.25,
                  f"the first iteration's mean reward is near chance (1/{VOCAB}): {rewards[0]:.3f}")
            check(max(rewards) >= 0.8, f"the mean reward rises to at least 0.8: {max(rewards):.3f}")
            check([it.get("rollout_weights_version") for it in iterations] == list(range(ITERATIONS)) and
                  [it.get("weights_version") for it in iterations] == list(range(1, ITERATIONS + 1)),
                  "iteration i samples from weights version i - 1 and loads version i into the rollout job")
            states, losses = [], []
            for it in iterations:
                got = plane.ctl("get", it["train_job"], "-o", "json")
                job_json = json.loads(got.stdout) if got.returncode == 0 else {}
                states.append(job_json.get("state", got.stderr))
                losses.append(job_json.get("metrics", {}).get("loss"))
            check(states == ["SUCCEEDED"] * ITERATIONS and None not in losses and
                  losses == [it["loss"] for it in iterations],
                  f"each iteration's train job is a job like any other, succeeded with its loss: {states} {losses}")
            answer = plane.ctl("generate", job, "--token-ids", "1,2," + str(MARKER), "-o", "json", "--sampling",
                               json.dumps({"temperature": 0, "max_tokens": 1}))
            responses = [json.loads(line) for line in answer.stdout.splitlines() if line.strip()]
            tokens = [int(t) for x in responses for d in x.get("samples", []) for t in d.get("token_ids", [])]
            versions = {int(x.get("weights_version", 0)) for x in responses}
            check(tokens == [TARGET] and versions == {ITERATIONS},
                  f"the served job now answers {tokens} (target {TARGET}) at weights version {versions}")

            # A user's scorer, run by loomctl on this machine: its rewards are what the train job reads.
            scorer = os.path.join(work, "score.py")
            with open(scorer, "w") as f:
                f.write("import json, sys\n"
                        "with open(sys.argv[2], 'w') as out:\n"
                        "    for line in open(sys.argv[1]):\n"
                        "        s = json.loads(line)\n"
                        "        reward = 0.25 if s['token_ids'][0] == s['reference'][0] else 0.75\n"
                        "        out.write(json.dumps({'id': s['id'], 'sample': s['sample'], 'reward': reward}) + '\\n')\n")
            scored = write_json(os.path.join(work, "scored-loop.json"), {
                "name": "rl-scored", "rollout_job": job, "prompts": prompts, "train": train, "iterations": 1,
                "sampling": {"n": 2, "max_tokens": 1, "temperature": 0}, "scorer": [sys.executable, scorer],
                "work_dir": os.path.join(work, "scored")})
            r = plane.ctl("rl", scored, "-o", "json", timeout=300)
            got = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
            check(r.returncode == 0 and len(got) == 1 and got[0].get("reward_mean") == 0.25 and
                  got[0].get("weights_version") == 1,
                  f"a scorer's rewards are used (greedy answers are all the target: reward 0.25): {got} "
                  f"{r.stderr.strip()[-300:]}")
            failing = write_json(os.path.join(work, "failing-loop.json"), {
                "rollout_job": job, "prompts": prompts, "train": train, "iterations": 1, "sampling": {"max_tokens": 1},
                "scorer": [sys.executable, "-c", "raise SystemExit(3)"], "work_dir": os.path.join(work, "failing")})
            r = plane.ctl("rl", failing)
            check(r.returncode != 0 and "ended with exit code 3; its output is in" in r.stderr,
                  f"a scorer that fails stops the loop, saying where its output is: {r.stderr.strip()}")

            bad = write_json(os.path.join(work, "bad-loop.json"), {"rollout_job": job, "prompts": prompts,
                                                                   "train": train, "iterations": 0})
            r = plane.ctl("rl", bad)
            check(r.returncode != 0 and "iterations: must be between 1" in r.stderr,
                  f"a loop of 0 iterations is refused naming the field: {r.stderr.strip()}")
            bad = write_json(os.path.join(work, "bad-loop2.json"), {"rollout_job": "no-such-job", "prompts": prompts,
                                                                    "train": train, "iterations": 1})
            r = plane.ctl("rl", bad)
            check(r.returncode != 0 and "iteration 1: rollout job no-such-job" in r.stderr,
                  f"a loop over a job that does not exist fails naming it: {r.stderr.strip()}")
            plane.ctl("cancel", job)
        finally:
            plane.close()
    sys.exit(exit_code())


if __name__ == "__main__":
    main()
