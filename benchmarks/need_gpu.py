"""The need an estimate reports, checked on a GPU: each setup runs under an allocator cap just below its
estimated need (it must run out of memory) and just above it (it must train).

    python benchmarks/need_gpu.py OUT_DIR          # on a CUDA GPU: OUT_DIR/need-caps.jsonl

The need is what `estimate` reports for a setup that does not fit: the smallest allocator cap under which the
simulated step's allocator replay runs (`trainmem.estimator._need`), found here by estimating each setup
under a 1 GiB cap, which none fits. Each run is a fresh `trainmem run` process (`--memory-cap` bytes), as a
user's would be; SIDE is how far below and above the need the two caps are. SETUPS were chosen before any ran.
"""

from __future__ import annotations

import json
import os
import sys
import time

SIDE = 0.01
"""The caps are the need x (1 - SIDE) and x (1 + SIDE)."""

SETUPS = [
    ("qwen2.5-0.5b", dict(precision="bf16", batch_size=4, seq_len=1024)),
    ("llama-3.2-1b", dict(precision="bf16", batch_size=4, seq_len=1024, peft="lora")),
    ("polyglot-ko-1.3b", dict(precision="fp16", batch_size=8, seq_len=256)),
    ("gpt2", dict(precision="fp32", batch_size=8, seq_len=1024)),
    ("qwen3-0.6b", dict(precision="amp-bf16", batch_size=8, seq_len=1024, peft="lora", checkpointing=True)),
]


def main(out_dir: str) -> int:
    from trainmem import TrainSetup, estimate, run

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "need-caps.jsonl")
    right = total = 0
    for model, kw in SETUPS:
        setup = TrainSetup(**kw)
        t0 = time.time()
        need = estimate(model, setup.replace(memory_cap=2**30)).memory["peak_reserved"]
        estimated_s = time.time() - t0
        for side, factor in (("below", 1 - SIDE), ("above", 1 + SIDE)):
            cap = int(need * factor)
            r = run(model, setup.replace(device="cuda", memory_cap=cap))
            ok = (r.status == "oom") if side == "below" else (r.status == "ok")
            right, total = right + ok, total + 1
            row = {"model": model, "setup": kw, "need": need, "side": side, "cap": cap, "status": r.status,
                   "right": ok, "peak_reserved": (r.memory or {}).get("peak_reserved"), "estimate_s": round(estimated_s, 1),
                   "env": r.env}
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{model} {kw} need {need / 2**30:.3f} GiB, cap {side} {cap / 2**30:.3f}: {r.status} "
                  f"({'right' if ok else 'WRONG'})", flush=True)
    print(f"{right} of {total} right")
    return 0 if right == total else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
