"""The step-time model against measured step times on the H200 (and the H100): fit, compare, and a held-out
set to measure. The command line of `lab/timing.py`, which holds the comparison, the fit and the
cross-validation (tests import it from there).

    python benchmarks/time_validate.py compare JSONL ...          # anywhere: predicted vs measured per row
    python benchmarks/time_validate.py compare docs/lab/data/*.jsonl  # the table of docs/data/time-in-sample.md
    python benchmarks/time_validate.py fit                        # anywhere: refit timing.FITTED on the fit files (lab/sets.json)
    python benchmarks/time_validate.py cv                         # anywhere: leave-one-file/model-out CV
    python benchmarks/time_validate.py noise                      # anywhere: setups measured more than once
    python benchmarks/time_validate.py measure OUT_DIR [INDEX ...] # on the H200: TIME_SET, one process each

`compare` splits rows into in-sample (the files the constants were fitted on: `"time": "fit"` in lab/sets.json, read by
`lab/timing.py`), held-out (any other file) and sharded (one rank of an N-GPU run, apart), and prints
per row the predicted and measured step time with the error, the median and worst absolute error, and the
Spearman rank correlation of predicted vs measured within each model; `lab/timing.py` says how a
row is measured and predicted.

`measure` runs TIME_SET with `trainmem run` in a fresh process each (validate.py's `isolated`), with
`STEPS` steps so that the median of at least four steady steps is timed (steps 1-2 are probed).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's lab/
from lab.timing import compare, cv, fit, noise  # noqa: E402

STEPS = 8
"""Steps per held-out run: 2 probed, then 6 timed (median of >= 4 steady steps)."""

ALL = dict(lora_targets=["all-linear"], lora_r=16)
TIME_SET: list[tuple[str, dict]] = [
    # qwen2.5-0.5b: small model, host-bound at small batch
    ("qwen", dict(precision="bf16", batch_size=1, seq_len=512)),
    ("qwen", dict(precision="bf16", batch_size=8, seq_len=512)),
    ("qwen", dict(precision="bf16", batch_size=32, seq_len=512, checkpointing=True)),
    ("qwen", dict(precision="bf16", batch_size=4, grad_accum=8, seq_len=512)),
    ("qwen", dict(precision="bf16", batch_size=16, seq_len=1024, peft="lora")),
    ("qwen", dict(precision="bf16", batch_size=16, seq_len=1024, peft="qlora", checkpointing=True)),
    ("qwen", dict(precision="bf16", batch_size=8, seq_len=512, optimizer="adamw-8bit")),
    ("qwen", dict(precision="amp-bf16", batch_size=16, seq_len=512, optimizer="adamw-fused")),
    # llama-3.2-1b: the middle
    ("llama", dict(precision="bf16", batch_size=2, seq_len=1024)),
    ("llama", dict(precision="bf16", batch_size=16, seq_len=1024)),
    ("llama", dict(precision="bf16", batch_size=16, seq_len=1024, checkpointing=True)),
    ("llama", dict(precision="bf16", batch_size=4, grad_accum=4, seq_len=1024)),
    ("llama", dict(precision="bf16", batch_size=32, seq_len=512, peft="lora", checkpointing=True)),
    ("llama", dict(precision="bf16", batch_size=8, seq_len=1024, peft="lora", **ALL)),
    ("llama", dict(precision="bf16", batch_size=8, seq_len=1024, peft="qlora")),
    ("llama", dict(precision="bf16", batch_size=8, grad_accum=2, seq_len=512, peft="qlora", checkpointing=True)),
    ("llama", dict(precision="bf16", batch_size=8, seq_len=1024, optimizer="adamw-8bit", checkpointing=True)),
    ("llama", dict(precision="fp32", batch_size=4, seq_len=512)),
    # llama-3.1-8b: big, compute-bound
    ("llama8b", dict(precision="bf16", batch_size=4, seq_len=1024, peft="lora")),
    ("llama8b", dict(precision="bf16", batch_size=16, seq_len=1024, peft="lora", checkpointing=True)),
    ("llama8b", dict(precision="bf16", batch_size=1, seq_len=512, peft="lora", grad_accum=8)),
    ("llama8b", dict(precision="bf16", batch_size=4, seq_len=1024, peft="qlora")),
    ("llama8b", dict(precision="bf16", batch_size=8, seq_len=1024, peft="qlora", checkpointing=True, **ALL)),
    ("llama8b", dict(precision="bf16", batch_size=2, seq_len=512, optimizer="adamw-8bit", checkpointing=True)),
    ("llama8b", dict(precision="bf16", batch_size=32, seq_len=512, peft="lora", checkpointing=True,
                     optimizer="adamw-8bit")),
    ("llama8b", dict(precision="bf16", batch_size=8, seq_len=1024, peft="qlora", grad_accum=2, checkpointing=True)),
]
"""The held-out timing set: three models 0.5B-8B, full/LoRA/QLoRA, checkpointing on and off, micro-batch
1-32, accumulation, sequence 512 and 1024, 8-bit and fused optimizers. Chosen before any of it ran."""


def measure(out_dir: str, indices: list[int]) -> int:
    """TIME_SET on this GPU, each setup in its own `trainmem run` process (validate.py's machinery)."""
    from validate import isolated  # benchmarks/, on sys.path as the script's folder

    return isolated(out_dir, indices, [(a, {**kw, "steps": STEPS}) for a, kw in TIME_SET],
                    "time-held-out.jsonl")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "compare":
        sys.exit(compare(args))
    if cmd == "fit":
        fit()
        sys.exit(0)
    if cmd == "cv":
        sys.exit(cv())
    if cmd == "noise":
        sys.exit(noise())
    if cmd == "measure":
        sys.exit(measure(args[0], [int(a) for a in args[1:]]))
    sys.exit(f"unknown command {cmd!r}: compare JSONL... | fit | cv | noise | measure OUT_DIR [INDEX...]")
