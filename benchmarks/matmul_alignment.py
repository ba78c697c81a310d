"""How much slower a half-precision matmul runs when a dimension is not a multiple of 8: the figure behind
`timing.UNALIGNED_SLOWDOWN` (derived from nanoGPT's reported 25%, not measured here yet).

    python benchmarks/matmul_alignment.py OUT_DIR            # on the GPU: GPT-2's head at 50257, 50264, 50304
    python benchmarks/matmul_alignment.py OUT_DIR --cpu      # anywhere: the same products, tiny, to check it runs

Times the three products of GPT-2's output head (768 wide) at 16384 tokens (batch 16 x 1024): the forward
(tokens x 768 @ 768 x V), the input gradient (tokens x V @ V x 768) and the weight gradient (V x tokens @
tokens x 768), in bf16 and fp16, each the median of 20 timed calls after 5 warm-up ones, for the vocabulary
as GPT-2 has it (50257), padded to 8 (50264) and to 64 (50304, nanoGPT's). Prints and writes
`matmul-alignment.json`: seconds, TFLOPS and each unaligned product's time per FLOP over the 50264 one's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any

import torch

VOCABS = (50257, 50264, 50304)
WIDTH = 768


def _products(tokens: int, vocab: int, dtype: torch.dtype, device: str) -> dict[str, Any]:
    x = torch.randn(tokens, WIDTH, dtype=dtype, device=device)
    w = torch.randn(vocab, WIDTH, dtype=dtype, device=device)
    dy = torch.randn(tokens, vocab, dtype=dtype, device=device)
    return {"forward": lambda: x @ w.t(), "input_grad": lambda: dy @ w, "weight_grad": lambda: dy.t() @ x}


def _seconds(fn: Any, device: str, repeat: int, warmup: int = 5) -> float:
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(device: str = "cuda", tokens: int = 16384, repeat: int = 20) -> list[dict[str, Any]]:
    """One row per (dtype, product, vocabulary): seconds, TFLOPS, and time per FLOP over the 50264 one's."""
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for vocab in VOCABS:
            for name, fn in _products(tokens, vocab, dtype, device).items():
                s = _seconds(fn, device, repeat)
                flops = 2 * tokens * vocab * WIDTH
                rows.append({"dtype": str(dtype).removeprefix("torch."), "product": name, "vocab": vocab,
                             "tokens": tokens, "seconds": s, "tflops": flops / s / 1e12})
    for r in rows:
        base = next(b for b in rows if (b["dtype"], b["product"], b["vocab"]) == (r["dtype"], r["product"], 50264))
        r["slowdown_per_flop"] = (r["seconds"] / r["vocab"]) / (base["seconds"] / base["vocab"])
    return rows


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
