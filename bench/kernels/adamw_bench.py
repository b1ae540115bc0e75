#!/usr/bin/env python3
"""AdamW on N fp32 parameters: Loom's CPU plugin against torch.optim.AdamW (single-tensor,
foreach, fused) and DeepSpeedCPUAdam, in one process, in interleaved rounds, beside this
machine's copy bandwidth measured in the same rounds.

Every implementation updates the same flat fp32 parameter of N elements (as ZeRO's CPU offload
holds a partition) with the same hyperparameters, on as many threads (torch.get_num_threads(); the
plugin gets as many of its own); Loom's step also runs on DeepSpeed's and fused torch's own state
tensors, so that each pair is timed on identical memory. Each round times one step of each, and
one memcpy of 1 GiB on as many threads (glibc; read + write counted). The memory-traffic floor of a step is 28 bytes per parameter
(read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq) at the round's copy
bandwidth; the fraction of the floor is floor / step time, per round, and its median is reported.

    python3 bench/kernels/adamw_bench.py --plugin build/lib/libloom_kernels_cpu.so \\
        [--params 100000000] [--rounds 21] [--json FILE]

LOOM_BENCH_RAW=1 also prints every round's numbers.
"""
import argparse
import ctypes
import json
import os
import statistics
import threading
import time

ABI_VERSION = 1


class Host(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_threads", ctypes.c_int32), ("isa", ctypes.c_char_p),
                ("parallel_for", ctypes.c_void_p), ("host_ctx", ctypes.c_void_p)]


class AdamConfig(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_double), ("beta1", ctypes.c_double), ("beta2", ctypes.c_double),
                ("eps", ctypes.c_double), ("weight_decay", ctypes.c_double), ("step", ctypes.c_int64),
                ("bias_correction", ctypes.c_int32), ("decoupled_weight_decay", ctypes.c_int32),
                ("amsgrad", ctypes.c_int32)]


INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Host))
LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_char_p)
ADAMW = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(AdamConfig), ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)
# loom_kernel_table (kernels/loom_kernel_abi.h) up to adamw_step.
OPS_BEFORE_ADAMW = ["rms_norm_forward", "rms_norm_backward", "rope_forward", "rope_backward", "swiglu_forward",
                    "swiglu_backward", "cross_entropy_forward", "cross_entropy_backward", "logprobs", "entropy",
                    "kl_divergence"]


class Table(ctypes.Structure):
    _fields_ = ([("abi_version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32), ("name", ctypes.c_char_p),
                 ("device", ctypes.c_char_p), ("isa", ctypes.c_char_p), ("init", INIT), ("last_error", LAST_ERROR)]
                + [(op, ctypes.c_void_p) for op in OPS_BEFORE_ADAMW] + [("adamw_step", ADAMW)])


def load_plugin(path, threads):
    lib = ctypes.CDLL(path)
    lib.loom_kernel_plugin.restype = ctypes.POINTER(Table)
    table = lib.loom_kernel_plugin().contents
    if table.abi_version != ABI_VERSION:
        raise SystemExit(f"{path}: kernel ABI version {table.abi_version}, this script speaks {ABI_VERSION}")
    host = Host(ctypes.sizeof(Host), threads, None, None, None)
    if table.init(ctypes.byref(host)) != 0:
        raise SystemExit(f"{path}: init failed: {table.last_error()}")
    return lib, table


def memcpy_bandwidth(src, dst, threads):
    """Bytes read + written per second of one memcpy of src into dst split over `threads` threads
    (ctypes releases the GIL during the call)."""
    libc = ctypes.CDLL(None)
    libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    n = src.numel() * src.element_size()
    parts = [(n * i // threads, n * (i + 1) // threads) for i in range(threads)]
    workers = [threading.Thread(target=libc.memcpy, args=(dst.data_ptr() + b, src.data_ptr() + b, e - b))
               for b, e in parts]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return 2 * n / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True, help="libloom_kernels_cpu.so")
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()

    import torch
    threads = torch.get_num_threads()
    lr, betas, eps, wd = 1e-3, (0.9, 0.999), 1e-8, 0.01
    n = args.params
    torch.manual_seed(0)

    # One parameter and gradient for everybody. Each optimizer keeps its own exp_avg and
    # exp_avg_sq, and Loom's step runs on those same tensors too ("Loom on X's tensors"): on this
    # VM, where a tensor lands in host memory changes its speed by up to a third, so Loom and each
    # competitor are timed on identical memory.
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    optimizers, errors = {}, {}
    try:
        import deepspeed
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        optimizers[f"DeepSpeedCPUAdam {deepspeed.__version__}"] = DeepSpeedCPUAdam(
            [p], lr=lr, betas=betas, eps=eps, weight_decay=wd, adamw_mode=True)
    except Exception as e:  # noqa: BLE001 - the JIT build can fail; the report says why
        errors["DeepSpeedCPUAdam"] = f"{type(e).__name__}: {e}"
    for label, kwargs in [("torch.optim.AdamW fused", dict(fused=True)),
                          ("torch.optim.AdamW foreach", dict(foreach=True)),
                          ("torch.optim.AdamW single-tensor", dict(foreach=False))]:
        optimizers[label] = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd, **kwargs)
    for opt in optimizers.values():  # warm-up: creates the state (and JIT-builds DeepSpeed's op)
        opt.step()

    _, table = load_plugin(args.plugin, threads)
    isa = table.isa.decode()
    config = AdamConfig(lr, betas[0], betas[1], eps, wd, 0, 1, 1, 0)

    def loom_on(state):
        m, v = state["exp_avg"], state["exp_avg_sq"]

        def step():
            config.step += 1
            rc = table.adamw_step(ctypes.byref(config), 0, p.data_ptr(), 0, p.grad.data_ptr(), m.data_ptr(),
                                  v.data_ptr(), n, None)
            if rc != 0:
                raise RuntimeError(f"adamw_step: {table.last_error()}")
        return step

    # (label, step, the label of the competitor it shares tensors with or None)
    steps = []
    for label, opt in optimizers.items():
        steps.append((label, opt.step, None))
        if "foreach" not in label and "single-tensor" not in label:
            steps.append((f"Loom cpu plugin ({isa}) on {label}'s tensors", loom_on(opt.state[p]), label))

    src, dst = torch.ones(1 << 28), torch.zeros(1 << 28)  # 1 GiB each
    for _, step, _ in steps:
        step()
    memcpy_bandwidth(src, dst, threads)
    times = {label: [] for label, _, _ in steps}
    copies = []
    for r in range(args.rounds):
        time.sleep(0.05)  # let OpenMP's spinning threads settle between implementations
        copies.append(memcpy_bandwidth(src, dst, threads))
        for label, step, _ in steps[r % len(steps):] + steps[:r % len(steps)]:  # another order each round
            time.sleep(0.05)
            start = time.perf_counter()
            step()
            times[label].append(time.perf_counter() - start)

    # The machine is shared and its bandwidth drifts: ratios are taken per round (a round's copy
    # and steps run within two seconds), then their median.
    results = {}
    for label, _, pair in steps:
        t = times[label]
        results[label] = {"median_s": statistics.median(t), "best_s": min(t), "times_s": t,
                          "floor_fraction": statistics.median(28 * n / c / x for c, x in zip(copies, t))}
        if pair:
            results[label]["speedup_over_pair"] = statistics.median(
                y / x for x, y in zip(t, times[pair]))
    out = {"params": n, "threads": threads, "torch": torch.__version__, "rounds": args.rounds,
           "copy_bandwidth_s": copies, "results": results, "errors": errors}
    print(f"{n / 1e6:.0f}M fp32 parameters, {threads} threads, {args.rounds} interleaved rounds")
    print(f"copy bandwidth (memcpy 1 GiB, read + write): median {statistics.median(copies) / 1e9:.2f} GB/s, "
          f"best {max(copies) / 1e9:.2f} GB/s; the floor at the median: "
          f"{28 * n / statistics.median(copies) * 1e3:.1f} ms (28 B/param)")
    print("| implementation | median ms | best ms | of the floor (median per round) | Loom's speedup on the same "
          "tensors (median per round) |\n|---|---|---|---|---|")
    for label, r in results.items():
        speedup = f"{r['speedup_over_pair']:.2f}x" if "speedup_over_pair" in r else ""
        print(f"| {label} | {r['median_s'] * 1e3:.1f} | {r['best_s'] * 1e3:.1f} | {100 * r['floor_fraction']:.0f}% "
              f"| {speedup} |")
    for label, why in errors.items():
        print(f"{label}: could not run: {why}")
    if os.environ.get("LOOM_BENCH_RAW"):
        print("copies GB/s", [round(c / 1e9, 1) for c in copies])
        for label, t in times.items():
            print(label, [round(x * 1e3, 1) for x in t])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
