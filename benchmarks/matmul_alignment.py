"""How much slower a half-precision matmul runs when a dimension is not a multiple of 8: the figure behind
`timing.UNALIGNED_SLOWDOWN` (derived from nanoGPT's reported 25%, not measured here yet).

    python benchmarks/matmul_alignment.py OUT_DIR            # on the GPU: GPT-2's head at 50257, 50264, 50304
    python benchmarks/matmul_alignment.py OUT_DIR --cpu      # anywhere: the same products, tiny, to check it runs

Times the three products of GPT-2's output head (768 wide) at 16384 tokens (batch 16 x 1024): the forward
(tokens x 768 @ 768 x V), the input gradient (tokens x V @ V x 768) and the weight gradient (V x tokens @
tokens x 768), in bf16 and fp16, each the median of 20 timed calls after 5 warm-up ones, for the vocabulary
as GPT-2 has it (50257), padded to 8 (50264) and to 64 (50304, nanoGPT's). Prints and writes
`matmul-alignment.json`: seconds, TFLOPS and each unaligned product's time per FLOP over the 50264 one's.
The measurement is `lab.alignment.measure`.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's lab/
from lab.alignment import measure  # noqa: E402


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cpu = "--cpu" in argv
    device = "cpu" if cpu or not torch.cuda.is_available() else "cuda"
    rows = measure(device, tokens=64 if cpu else 16384, repeat=3 if cpu else 20)
    env = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__}
    with open(os.path.join(argv[0], "matmul-alignment.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    print(f"{env['device']}, torch {env['torch']}")
    print("dtype     product       vocab   ms      TFLOPS  time per FLOP over 50264's")
    for r in rows:
        print(f"{r['dtype']:9} {r['product']:12} {r['vocab']:6} {r['seconds'] * 1e3:7.3f} {r['tflops']:7.1f}  "
              f"{r['slowdown_per_flop']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
