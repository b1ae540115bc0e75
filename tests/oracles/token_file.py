"""Loom's token file format (`*.tokens`) and sample order, in Python, for the reference oracles.

Mirrors worker/data/token_file.{h,cc} and worker/data/sample_order.{h,cc}:
  bytes 0-7   magic b"LOOMTOK1"
  bytes 8-15  little-endian uint64 H, the length of the JSON header
  bytes 16..  H bytes of UTF-8 JSON: format_version, dtype, vocab_size, num_tokens, tokenizer,
              eos_token_id, document_starts
  zero padding up to roundup(16 + H, 64)
  num_tokens little-endian tokens of dtype ("uint16" or "uint32")
"""
import json
import os
import struct

import numpy as np

MAGIC = b"LOOMTOK1"
ALIGNMENT = 64
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MASK64 = (1 << 64) - 1


def _round_up(n, multiple):
    return (n + multiple - 1) // multiple * multiple


def write_token_file(path, tokens, vocab_size, dtype="uint16", tokenizer="test", eos_token_id=-1,
                     document_starts=None):
    """Writes `tokens` (any int sequence) as a token file. document_starts defaults to [0] (one
    document), or [] for no tokens."""
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be uint16 or uint32, got {dtype}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"tokens must lie in [0, {vocab_size})")
    if document_starts is None:
        document_starts = [0] if tokens.size else []
    header = {
        "format_version": 1,
        "dtype": dtype,
        "vocab_size": int(vocab_size),
        "num_tokens": int(tokens.size),
        "tokenizer": tokenizer,
        "eos_token_id": int(eos_token_id),
        "document_starts": [int(s) for s in document_starts],
    }
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")  # as nlohmann dump()
    start = _round_up(16 + len(text), ALIGNMENT)
    prefix = MAGIC + struct.pack("<Q", len(text)) + text
    prefix += b"\0" * (start - len(prefix))
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(prefix)
        f.write(tokens.astype(DTYPES[dtype]).tobytes())
    os.replace(tmp, path)


def read_token_file(path):
    """Returns (header dict, tokens as an int64 numpy array)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: bad magic {data[:8]!r}")
    (h,) = struct.unpack("<Q", data[8:16])
    header = json.loads(data[16:16 + h].decode("utf-8"))
    if header.get("format_version") != 1:
        raise ValueError(f"{path}: unsupported format_version {header.get('format_version')}")
    dt = DTYPES[header["dtype"]]
    start = _round_up(16 + h, ALIGNMENT)
    n = header["num_tokens"]
    if len(data) < start + n * dt.itemsize:
        raise ValueError(f"{path}: file too short for {n} tokens")
    tokens = np.frombuffer(data, dtype=dt, count=n, offset=start).astype(np.int64)
    return header, tokens


# ----- sample order (worker/data/sample_order.cc) -----

def num_samples(num_tokens, seq_len):
    return (num_tokens - 1) // seq_len


def sample(tokens, i, seq_len):
    """(inputs, labels) of sample i: the window tokens[i*seq_len : i*seq_len + seq_len + 1]."""
    w = tokens[i * seq_len: i * seq_len + seq_len + 1]
    return w[:-1], w[1:]


def permutation(n, seed, epoch):
    """Fisher-Yates over range(n) driven by SplitMix64 seeded with seed * 0x100000001b3 + epoch."""
    state = (seed * 0x100000001B3 + epoch) & MASK64
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
        j = z % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class SampleOrder:
    """The endless order of samples: position p -> permutation_{p // n}[p % n]."""

    def __init__(self, n, seed):
        if n <= 0:
            raise ValueError("no samples")
        self.n, self.seed, self._epoch, self._perm = n, seed, -1, None

    def sample_at(self, position):
        epoch = position // self.n
        if epoch != self._epoch:
            self._perm, self._epoch = permutation(self.n, self.seed, epoch), epoch
        return self._perm[position % self.n]


def micro_batch_start(step, train_batch_size, micro_index, micro, rank, world):
    """Global position of the first sample of micro-batch `micro_index` of `rank` at step `step` (0-based)."""
    return step * train_batch_size + (micro_index * world + rank) * micro
