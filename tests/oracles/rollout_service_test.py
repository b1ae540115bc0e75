"""A served rollout (rollout.serve true) through a real control plane (`loomd --standalone` on
loopback, a CPU rank), driven by `loomctl generate` and `loomctl rollout` against transformers:

1. Greedy tokens streamed by Generate (token ids and text) and returned by GenerateBatch equal
   transformers' `generate` on the served weights, with weights version 0 in every response.
2. UpdateWeights mid-stream: a stream in flight when the update is asked finishes on the old
   weights (version 0); requests after it get the new weights' tokens (version 1), from a Hugging
   Face directory, then from a train job's latest checkpoint (`--from-job`), each equal to
   transformers' generate on those weights.
3. Pause, abort and cancel: a stream paused in flight and aborted by an update ends with finish
   reason "aborted"; a stream whose client is killed while paused frees its KV blocks.
4. Bad input is refused naming it while a long stream keeps being served to the end: a prompt
   longer than the context, a request too long for the whole KV cache, top_p outside (0, 1], an
   unknown sampling key, weights of another shape on reload (the old weights keep serving), a
   job that is not a served rollout.
5. Served over two ranks of tensor parallelism: the same tokens, before and after UpdateWeights.

  python3 tests/oracles/rollout_service_test.py --bin build/bin
"""
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import grpc  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from checkpoint_damage_test import corrupt  # noqa: E402
import parity_test  # noqa: E402
from parity_test import ControlPlane, check  # noqa: E402
from rollout_test import BLOCK_BYTES, hf_greedy, prompts_of, train_tokenizer  # noqa: E402


def greedy_sampling(max_tokens, **extra):
    return json.dumps({"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, **extra})


def stream_lines(process):
    """The JSON responses a `loomctl generate -o json` process printed (after those read already),
    once it has ended. Read through the pipe's buffer: communicate() would skip what readline()
    buffered."""
    out = process.stdout.read()
    err = process.stderr.read()
    process.wait(timeout=180)
    return [json.loads(line) for line in out.splitlines() if line.strip()], err, process.returncode


def tokens_of(responses, sample=0):
    """A sample's token ids over a stream's responses (JSON gives int64 as strings)."""
    return [int(t) for r in responses for d in r.get("samples", []) if d.get("sample", 0) == sample
            for t in d.get("token_ids", [])]


def versions_of(responses):
    return {int(r.get("weights_version", 0)) for r in responses}


def finish_of(responses):
    reasons = [d["finish_reason"] for r in responses for d in r.get("samples", []) if d.get("finish_reason")]
    return reasons[-1] if reasons else None


def generate(plane, job, prompt, max_tokens, **extra):
    ids = ",".join(str(t) for t in prompt)
    r = plane.ctl("generate", job, "--token-ids", ids, "--sampling", greedy_sampling(max_tokens, **extra), "-o", "json",
                  "--wait", "120")
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()], r


def wait_first_response(process):
    """Reads the first response line of a streaming `loomctl generate -o json` (its request is
    accepted and in flight)."""
    line = process.stdout.readline()
    return json.loads(line) if line else None


def wait_tokens(process):
    """Reads a streaming `loomctl generate -o json` until a response carries tokens."""
    for line in process.stdout:
        response = json.loads(line)
        if tokens_of([response]):
            return response
    return None


def run(bin_dir, work):
    model_a = os.path.join(work, "weights-a")
    model_b = os.path.join(work, "weights-b")
    a = parity_test.save_model("llama", model_a, seed=5).eval()
    b = parity_test.save_model("llama", model_b, seed=6).eval()
    wrong = os.path.join(work, "weights-wrong")
    parity_test.save_model("qwen2", wrong, seed=7)  # q/k/v biases: tensors the llama does not have
    misshapen = os.path.join(work, "weights-misshapen")  # weights A with a final norm twice as wide
    os.makedirs(misshapen)
    tensors = load_file(os.path.join(model_a, "model.safetensors"))
    tensors["model.norm.weight"] = torch.cat([tensors["model.norm.weight"]] * 2)
    save_file(tensors, os.path.join(misshapen, "model.safetensors"), metadata={"format": "pt"})
    tokenizer_dir = train_tokenizer(os.path.join(work, "tokenizer"))
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tokenizer_dir, "tokenizer.json"))

    plane = ControlPlane(bin_dir, work)
    try:
        # 12 KV blocks of 16 tokens: a sequence of up to 192 tokens fits, several preempt each other.
        job = plane.submit({"name": "served", "kind": "rollout", "resources": {"ranks": 1},
                            "model": {"config": os.path.join(model_a, "config.json"), "weights": model_a},
                            "rollout": {"serve": True, "tokenizer": tokenizer_dir, "max_num_seqs": 8,
                                        "max_num_batched_tokens": 64,
                                        "kv_cache_memory_gb": 12 * BLOCK_BYTES / 2**30}})
        first = plane.status(job)
        check(int(first.get("kv_blocks_total", 0)) == 12,
              f"served: rank 0 serves, KV cache of {first.get('kv_blocks_total')} blocks")

        # Rank 0's own port serves TLS with a certificate for this attempt alone, from the
        # planner's own CA, and answers the planner only (its attempt's service token).
        rank0 = json.loads(plane.ctl("get", job, "-o", "json").stdout)["ranks"][0]["service_address"]
        host, port = rank0.rsplit(":", 1)
        served = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"], capture_output=True,
                                text=True, input=ssl.get_server_certificate((host, int(port))))
        name = served.stdout.split("DNS:")[-1].strip()
        check(name.startswith("attempt-1.") and name.endswith(".rank.loom"),
              f"rank 0 serves TLS as its attempt ({name!r})")
        with open(os.path.join(work, "state", "planner", "service-ca.crt"), "rb") as f:
            service_ca = grpc.ssl_channel_credentials(root_certificates=f.read())
        for what, channel, code, says in [
                ("a plain-text caller", grpc.insecure_channel(rank0), grpc.StatusCode.UNAVAILABLE, ""),
                ("a caller expecting attempt 2", grpc.secure_channel(
                    rank0, service_ca, options=[("grpc.ssl_target_name_override", "attempt-2." + name[10:])]),
                 grpc.StatusCode.UNAVAILABLE, ""),
                ("a TLS caller without the planner's token", grpc.secure_channel(
                    rank0, service_ca, options=[("grpc.ssl_target_name_override", name)]),
                 grpc.StatusCode.UNAUTHENTICATED, "answers the planner only")]:
            for method in ("GetRolloutStatus", "UpdateWeights"):
                try:
                    channel.unary_unary(f"/loom.v1.RolloutService/{method}")(b"", timeout=10)
                    check(False, f"rank 0's {method} answered {what}")
                except grpc.RpcError as e:
                    check(e.code() == code and says in e.details(),
                          f"rank 0's own {method} refuses {what}: {e.code().name}")
            channel.close()

        # 1. Generate and GenerateBatch against transformers on weights A.
        prompts = prompts_of([3, 17, 40, 1, 25, 9], seed=3)
        got, r = generate(plane, job, prompts[2], 24)
        check(r.returncode == 0 and tokens_of(got) == hf_greedy(a, prompts[2], 24) and versions_of(got) == {0},
              f"Generate: streamed greedy tokens equal transformers' generate, weights version 0 ({r.stderr.strip()})")
        check(finish_of(got) == "length", f"Generate: finish reason length ({finish_of(got)})")

        text = "This License applies to any program"
        r = plane.ctl("generate", job, "--prompt", text, "--sampling", greedy_sampling(30))
        expected = hf_greedy(a, hf_tokenizer(text)["input_ids"], 30)
        want = hf_tokenizer.decode(expected, skip_special_tokens=True)
        check(r.returncode == 0 and r.stdout == want, f"Generate: streamed text equals transformers' ({r.stdout!r})")

        batch_file = os.path.join(work, "batch.jsonl")
        with open(batch_file, "w") as f:
            for i, p in enumerate(prompts):
                f.write(json.dumps({"id": f"b{i}", "prompt_token_ids": p,
                                    "sampling": {"temperature": 0, "max_tokens": 12 + i, "ignore_eos": True}}) + "\n")
        r = plane.ctl("generate", job, "--file", batch_file)
        results = {json.loads(line)["id"]: json.loads(line) for line in r.stdout.splitlines() if line.strip()}
        same = [[int(t) for t in results.get(f"b{i}", {}).get("token_ids", [])] == hf_greedy(a, p, 12 + i)
                for i, p in enumerate(prompts)]
        check(r.returncode == 0 and all(same), f"GenerateBatch: {sum(same)} of {len(prompts)} equal transformers' "
                                               f"({r.stderr.strip()})")

        # 2. UpdateWeights while a long stream (4 samples of 150 tokens, preempting each other in
        # 12 blocks) is in flight: it finishes on the old weights; what follows gets the new. The
        # stream may end before the update arrives: then again, the other way round.
        models = [(a, model_a), (b, model_b)]
        overlapped = False
        for attempt in range(1, 4):
            (old, _), (new, new_dir) = models[(attempt - 1) % 2], models[attempt % 2]
            long_stream = plane.ctl_popen("generate", job, "--token-ids", ",".join(map(str, prompts[1])),
                                          "--sampling", greedy_sampling(150, n=4), "-o", "json")
            head = wait_first_response(long_stream)
            reload = plane.ctl_popen("rollout", "reload", job, "--from", new_dir, "-o", "json")
            while True:  # the update waits for the stream, or the stream was done first
                s = plane.status(job)
                if int(s.get("updates_pending", 0)) > 0 or int(s.get("weights_version", 0)) == attempt:
                    break
                time.sleep(0.01)
            overlapped = int(s.get("updates_pending", 0)) > 0
            after, r = generate(plane, job, prompts[2], 24)
            rest, err, code = stream_lines(long_stream)
            long = [head] + rest
            reload_out, reload_err = reload.communicate(timeout=120)
            what = f"UpdateWeights {attempt} --from {os.path.basename(new_dir)}"
            check(reload.returncode == 0 and int(json.loads(reload_out)["weights_version"]) == attempt,
                  f"{what}: version {attempt} ({reload_err.strip()})")
            old_tokens = hf_greedy(old, prompts[1], 150)
            check(code == 0 and all(tokens_of(long, j) == old_tokens for j in range(4))
                  and versions_of(long) == {attempt - 1},
                  f"{what}: the stream in flight (the update waited for it: {overlapped}) finishes on the old "
                  f"weights, version {attempt - 1} throughout")
            check(r.returncode == 0 and tokens_of(after) == hf_greedy(new, prompts[2], 24)
                  and versions_of(after) == {attempt},
                  f"{what}: a request after it gets the new weights' tokens (transformers on them), version {attempt}")
            if overlapped:
                break
        check(overlapped, "UpdateWeights: an update arrived while a stream was in flight and waited for it")

        # ... and from a train job's latest checkpoint (--from-job), as an RL loop alternates them.
        data, _ = parity_test.licence_tokens_and_model(bin_dir, work, "rl", seed=1)
        checkpoints = os.path.join(work, "rl-checkpoints")
        train = plane.submit({"name": "rl-train", "kind": "train", "resources": {"ranks": 1},
                              "model": {"config": os.path.join(model_b, "config.json"), "weights": model_b},
                              "data": {"train": data, "seq_len": 32, "seed": 3},
                              "train": {"steps": 3, "checkpoint_dir": checkpoints},
                              "deepspeed": {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
                                            "optimizer": {"type": "AdamW", "params": {"lr": 3e-2}}}})
        w = plane.ctl("wait", train, "--timeout", "300", timeout=320)
        check(w.returncode == 0, f"the train job succeeds ({w.stdout.strip()} {w.stderr.strip()})")
        r = plane.ctl("rollout", "reload", job, "--from-job", train, "--version", "7", "-o", "json")
        check(r.returncode == 0 and int(json.loads(r.stdout or "{}").get("weights_version", 0)) == 7
              and json.loads(r.stdout).get("weights_source", "").endswith("global_step3"),
              f"UpdateWeights --from-job: the train job's latest checkpoint as version 7 ({r.stdout.strip()} "
              f"{r.stderr.strip()})")
        trained = AutoModelForCausalLM.from_pretrained(os.path.join(checkpoints, "global_step3"),
                                                       dtype=torch.float32).eval()
        got, r = generate(plane, job, prompts[4], 20)
        check(tokens_of(got) == hf_greedy(trained, prompts[4], 20) and versions_of(got) == {7},
              "UpdateWeights --from-job: tokens equal transformers' on the checkpoint, version 7")
        check(tokens_of(got) != hf_greedy(b, prompts[4], 20), "the trained weights differ from the ones before")
        # An update reads and checks the weights' files only: damage to the optimizer state is not its concern,
        # damage to the weights is refused by name (below, with the other refusals).
        damaged = os.path.join(work, "damaged-step3")
        shutil.copytree(os.path.join(checkpoints, "global_step3"), damaged)
        corrupt(os.path.join(damaged, "optimizer.safetensors"))
        r = plane.ctl("rollout", "reload", job, "--from", damaged, "--version", "7", "-o", "json")
        check(r.returncode == 0, f"UpdateWeights from a tag whose optimizer state is damaged loads its weights "
                                 f"({r.stderr.strip()})")
        corrupt(os.path.join(damaged, "model.safetensors"))

        # 3. Pause, then an update that aborts the stream in flight; cancel frees blocks.
        paused = json.loads(plane.ctl("rollout", "pause", job, "-o", "json").stdout)
        check(paused.get("paused") is True, "Pause: the rollout is paused")
        stream = plane.ctl_popen("generate", job, "--token-ids", ",".join(map(str, prompts[0])),
                                 "--sampling", greedy_sampling(150), "-o", "json")
        head = wait_first_response(stream)  # accepted: in flight, but nothing computed while paused
        r = plane.ctl("rollout", "reload", job, "--from", model_a)
        check(r.returncode != 0 and "paused with 1 request(s) in flight" in r.stderr,
              f"UpdateWeights while paused with a request in flight is refused unless it aborts ({r.stderr.strip()})")
        r = plane.ctl("rollout", "reload", job, "--from", model_a, "--abort", "-o", "json")
        rest, err, code = stream_lines(stream)
        check(r.returncode == 0 and finish_of([head] + rest) == "aborted" and not tokens_of([head] + rest),
              f"UpdateWeights --abort: the paused stream ends with finish reason aborted ({finish_of([head] + rest)})")
        plane.ctl("rollout", "resume", job)
        # Until the pause catches the stream in flight, holding blocks: a busy machine lets the
        # 150 tokens finish before a pause arrives now and then.
        for _ in range(20):
            stream = plane.ctl_popen("generate", job, "--token-ids", ",".join(map(str, prompts[2])),
                                     "--sampling", greedy_sampling(150), "-o", "json")
            head = wait_tokens(stream)
            plane.ctl("rollout", "pause", job)
            held = plane.status(job)
            if int(held.get("kv_blocks_used", 0)) > 0:
                break
            stream_lines(stream)
            plane.ctl("rollout", "resume", job)
        stream.kill()  # the client goes away
        stream.wait()
        freed = None
        for _ in range(250):
            s = plane.status(job)
            if int(s.get("kv_blocks_used", 0)) == 0 and int(s.get("requests_running", 0)) == 0:
                freed = s
                break
            time.sleep(0.02)
        check(head is not None and int(held.get("kv_blocks_used", 0)) > 0 and freed is not None,
              f"a stream whose client went away is cancelled and frees its {held.get('kv_blocks_used')} KV blocks "
              f"(while paused)")
        plane.ctl("rollout", "resume", job)
        got, r = generate(plane, job, prompts[3], 10)
        check(tokens_of(got) == hf_greedy(a, prompts[3], 10), "after abort and resume: weights A serve again")

        # 4. Refusals while a long stream keeps being served.
        keeps = plane.ctl_popen("generate", job, "--token-ids", ",".join(map(str, prompts[5])),
                                "--sampling", greedy_sampling(150), "-o", "json")
        keeps_head = wait_first_response(keeps)

        def refused(what, args, expected):
            r = plane.ctl(*args)
            check(r.returncode != 0 and expected in r.stderr, f"refused ({what}): {r.stderr.strip()[:220]}")

        refused("prompt longer than the context", ["generate", job, "--token-ids", ",".join(["5"] * 300)],
                "prompt: 300 tokens leave no room for output in the model's context of 256")
        refused("a sequence longer than the whole KV cache",
                ["generate", job, "--token-ids", "5,6,7", "--sampling", greedy_sampling(240)],
                "needs 16 KV blocks of 16 tokens, and the KV cache holds 12")
        refused("top_p outside (0, 1]", ["generate", job, "--token-ids", "5", "--sampling", '{"top_p": 0}'],
                "sampling_json.top_p: 0 is outside (0, 1]")
        refused("unknown sampling key", ["generate", job, "--token-ids", "5", "--sampling", '{"best_of": 2}'],
                "sampling_json.best_of: unknown key")
        before = plane.status(job)
        refused("weights of another shape", ["rollout", "reload", job, "--from", misshapen],
                "tensor model.norm.weight has shape [128], the model's config wants [64]")
        refused("weights of another model", ["rollout", "reload", job, "--from", wrong],
                "is not a parameter of this llama model")
        refused("a checkpoint whose weights are damaged", ["rollout", "reload", job, "--from", damaged],
                os.path.join(damaged, "model.safetensors") + ": CRC-32 does not match the manifest")
        after = plane.status(job)
        check(after["weights_version"] == before["weights_version"] and after["weights_source"] == before["weights_source"],
              "refused weights: the old ones keep serving (same version and source)")
        refused("a train job is not a served rollout", ["generate", train, "--token-ids", "5"],
                f"job {train} is a train job")
        refused("an unknown job", ["generate", "no-such-job", "--token-ids", "5"], "no-such-job")
        rest, err, code = stream_lines(keeps)
        kept = tokens_of([keeps_head] + rest)
        check(code == 0 and kept == hf_greedy(a, prompts[5], 150),
              f"the long stream is served to the end meanwhile ({len(kept)} tokens, transformers' own)")

        r = plane.ctl("cancel", job)
        check(r.returncode == 0, "the served rollout is cancelled like any job")
        plane.ctl("wait", job, "--timeout", "60")

        # 5. Served over two ranks that split the model (AutoTP): rank 0 serves, both compute, both reload.
        tp_job = plane.submit({"name": "served-tp", "kind": "rollout", "resources": {"ranks": 2},
                               "model": {"config": os.path.join(model_a, "config.json"), "weights": model_a},
                               "deepspeed": {"tensor_parallel": {"autotp_size": 2}},
                               "rollout": {"serve": True, "max_num_seqs": 8, "max_num_batched_tokens": 64}})
        got, r = generate(plane, tp_job, prompts[2], 24)
        check(r.returncode == 0 and tokens_of(got) == hf_greedy(a, prompts[2], 24),
              f"tensor parallel 2: streamed greedy tokens equal transformers' ({r.stderr.strip()})")
        r = plane.ctl("rollout", "reload", tp_job, "--from", model_b)
        got, _ = generate(plane, tp_job, prompts[2], 24)
        check(r.returncode == 0 and tokens_of(got) == hf_greedy(b, prompts[2], 24) and versions_of(got) == {1},
              f"tensor parallel 2: after UpdateWeights every rank computes with the new weights ({r.stderr.strip()})")
        plane.ctl("cancel", tp_job)
    finally:
        plane.close()


def main():
    a = oracle_args(__doc__)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="loom-rollout-service-") as work:
        run(a.bin, work)
    return parity_test.exit_code()


if __name__ == "__main__":
    sys.exit(main())
