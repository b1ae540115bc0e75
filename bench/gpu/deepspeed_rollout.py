"""DeepSpeed's rollout engine (deepspeed.runtime.rollout.HybridEngineRollout, DeepSpeed 0.19.8), the
DeepSpeed reference of bench/gpu/rollout.sh: a random model of the given config in bf16 (sdpa
attention) wrapped by deepspeed.initialize (ZeRO stage 0, no optimizer; a one-process group) on one
GPU, a batch of random prompts of equal length, greedy, exactly `new` tokens each (no end token:
the model's and the rollout's end-of-sequence ids are unset). --mode picks DeepSpeed's generation
path:

  plain                     HybridEngineRolloutConfig() : transformers' generate on the engine's module
  graph_capture             use_graph_capture=True      : StaticCache prefill, CUDA-graph decode
  continuous                continuous_batch_size=batch : DeepSpeed's continuous-batching scheduler
  continuous_graph_capture  both                        : continuous batching with a CUDA-graph decode

Prints one JSON line: output tokens/s over one timed rollout.generate call (after one warm-up call
of the same shape; graph_capture captures its graph inside every call, as DeepSpeed does, while
continuous_graph_capture keeps the one its warm-up captured).

  python3 bench/gpu/deepspeed_rollout.py --config CONFIG --batch 256 --prompt 128 --new 256 [--mode MODE]

--device cpu (a check on a tiny config; plain and continuous only: DeepSpeed's CPU accelerator has
no streams or graphs, and continuous_graph_capture asks for CUDA).
"""
import argparse
import contextlib
import json
import os
import socket
import sys
import time
from types import SimpleNamespace

import torch
import transformers

# mode: (HybridEngineRolloutConfig.use_graph_capture, whether SamplingConfig.continuous_batch_size is set)
MODES = {"plain": (False, False), "graph_capture": (True, False), "continuous": (False, True),
         "continuous_graph_capture": (True, True)}


def add_query_offset():
    """transformers 5.x builds the causal mask from cache.get_query_offset(layer) (the position of the
    step's first query token, the tokens already cached) where 4.x took cache_position; DeepSpeed
    0.19.8's DeepSpeedStaticCache, the cache of its graph-capture and continuous decodes, lacks it.
    The query sits where the cache writes it: the shared write position (one per row in continuous
    batching, where the rows' decode front is the largest). A tensor, as transformers' StaticLayer
    gives, so that a captured graph reads the position of each replay."""
    from deepspeed.utils.static_cache import DeepSpeedStaticCache
    if hasattr(DeepSpeedStaticCache, "get_query_offset"):
        return

    def get_query_offset(self, layer_idx=0):
        position = self._write_position
        if position is None:
            return 0
        return position.max() if position.dim() == 1 else position

    DeepSpeedStaticCache.get_query_offset = get_query_offset


def run(a):
    import deepspeed
    from deepspeed.runtime.rollout import HybridEngineRollout, RolloutRequest, SamplingConfig
    from deepspeed.runtime.rollout.hybrid_engine_rollout import HybridEngineRolloutConfig

    graphs, continuous = MODES[a.mode]
    if a.mode != "plain":
        add_query_offset()
    with socket.socket() as s:  # a free port for the one-process group
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for key, value in [("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", port)]:
        os.environ.setdefault(key, value)
    if a.device == "cuda":
        torch.cuda.set_device(0)
    deepspeed.init_distributed(dist_backend="nccl" if a.device == "cuda" else "gloo", auto_mpi_discovery=False)

    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(a.config)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None  # end tokens ignored: every row generates `new` tokens
    engine, _, _, _ = deepspeed.initialize(model=model.to(a.device), config={
        "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 0}})
    engine.eval()
    # The rollout reads only pad_token_id and eos_token_id of its tokenizer; the prompts are token ids.
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=None)
    rollout = HybridEngineRollout(engine, tokenizer, HybridEngineRolloutConfig(use_graph_capture=graphs))

    prompts = torch.randint(3, config.vocab_size, (a.batch, a.prompt), device=a.device)
    request = RolloutRequest(prompt_ids=prompts, prompt_attention_mask=torch.ones_like(prompts))
    sampling = SamplingConfig(max_new_tokens=a.new, temperature=0.0,
                              continuous_batch_size=a.batch if continuous else None)

    def synchronize():
        if a.device == "cuda":
            torch.cuda.synchronize()

    rollout.generate(request, sampling)
    synchronize()
    start = time.perf_counter()
    out = rollout.generate(request, sampling)
    synchronize()
    seconds = time.perf_counter() - start
    new = out.input_ids.shape[1] - a.prompt
    if out.input_ids.shape[0] != a.batch or new != a.new:
        raise SystemExit(f"expected {a.batch} rows of {a.new} new tokens, got {tuple(out.input_ids.shape)}")
    flags = f"use_graph_capture={graphs}" + (f", continuous_batch_size={a.batch}" if continuous else "")
    return {"reference": f"deepspeed HybridEngineRollout {a.mode} ({flags})", "version": deepspeed.__version__,
            "transformers": transformers.__version__, "mode": a.mode, "batch": a.batch, "prompt": a.prompt,
            "new": a.new, "seconds": seconds, "output_tokens_per_s": a.batch * new / seconds}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--mode", choices=list(MODES), default="plain")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = p.parse_args()
    # DeepSpeed logs to stdout (its handler takes sys.stdout when deepspeed is imported, inside this
    # block): stdout keeps only the JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        result = run(a)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
