"""The GPU benchmarks' data: SAMPLES samples of 2048 + 1 random token ids over Llama 3's vocabulary
(128,256) or VOCAB, in Loom's token-file format.

  python3 bench/gpu/random_tokens.py OUT.tokens SAMPLES [VOCAB]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "oracles"))

import numpy as np  # noqa: E402
from token_file import write_token_file  # noqa: E402

vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 128256
write_token_file(sys.argv[1], np.random.default_rng(0).integers(0, vocab, int(sys.argv[2]) * 2049), vocab, "uint32")
