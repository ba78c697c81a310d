"""How much slower a half-precision matmul runs when a dimension is not a multiple of 8: the measurement
behind `UNALIGNED_SLOWDOWN` of the step-time model (`benchmarks/matmul_alignment.py` is its command line; on
the CPU it only checks that the measurement runs).

Times the three products of GPT-2's output head (`WIDTH` wide): the forward (tokens x 768 @ 768 x V), the input
gradient (tokens x V @ V x 768) and the weight gradient (V x tokens @ tokens x 768), in bf16 and fp16, for the
vocabulary as GPT-2 has it (50257), padded to 8 (50264) and to 64 (50304, nanoGPT's). Each unaligned product is
compared per FLOP with the 50264 one, so that the figure is the alignment's alone, not the extra columns'.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

VOCABS = (50257, 50264, 50304)
"""GPT-2's vocabulary, padded to a multiple of 8 (the baseline), and to 64 (nanoGPT's)."""
WIDTH = 768
"""GPT-2's hidden size: the head's other dimension."""
ALIGNED = 50264
"""The vocabulary each product is compared with."""


def _products(tokens: int, vocab: int, dtype: torch.dtype, device: str) -> dict[str, Callable[[], torch.Tensor]]:
    x = torch.randn(tokens, WIDTH, dtype=dtype, device=device)
    w = torch.randn(vocab, WIDTH, dtype=dtype, device=device)
    dy = torch.randn(tokens, vocab, dtype=dtype, device=device)
    return {"forward": lambda: x @ w.t(), "input_grad": lambda: dy @ w, "weight_grad": lambda: dy.t() @ x}


def _seconds(fn: Callable[[], Any], device: str, repeat: int, warmup: int = 5) -> float:
    """The median of `repeat` timed calls after `warmup` untimed ones; on CUDA timed by events, so that the
    figure is the kernel's, not the launch's."""
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
    """One row per (dtype, product, vocabulary): seconds, TFLOPS, and time per FLOP over the 50264 one's
    (`slowdown_per_flop`, 1 for the aligned vocabulary itself)."""
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for vocab in VOCABS:
            for name, fn in _products(tokens, vocab, dtype, device).items():
                s = _seconds(fn, device, repeat)
                flops = 2 * tokens * vocab * WIDTH
                rows.append({"dtype": str(dtype).removeprefix("torch."), "product": name, "vocab": vocab,
                             "tokens": tokens, "seconds": s, "tflops": flops / s / 1e12})
    for r in rows:
        base = next(b for b in rows if (b["dtype"], b["product"], b["vocab"]) == (r["dtype"], r["product"], ALIGNED))
        r["slowdown_per_flop"] = (r["seconds"] / r["vocab"]) / (base["seconds"] / base["vocab"])
    return rows
