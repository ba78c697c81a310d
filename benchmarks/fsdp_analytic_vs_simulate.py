"""The analytic FSDP closed form next to the simulated FSDP2 rank (fake process group, fake CPU tensors),
per GPU, for docs/lab/sharding.md. Usage: PYTHONPATH=src python benchmarks/fsdp_analytic_vs_simulate.py"""

from __future__ import annotations

import time
import warnings

from trainmem import TrainSetup
from trainmem.estimator import estimate

warnings.filterwarnings("ignore")
ROWS = [
    ("llama-3.2-1b", dict(gpus=8, batch_size=2, seq_len=1024, precision="amp-bf16")),
    ("llama-3.2-1b", dict(gpus=8, batch_size=2, seq_len=1024, precision="amp-bf16", checkpointing=True)),
    ("llama-3.2-1b", dict(gpus=2, batch_size=2, seq_len=1024, precision="bf16")),
    ("llama-3.2-1b", dict(gpus=8, batch_size=2, seq_len=1024, precision="bf16", peft="lora")),
    ("qwen2.5-0.5b", dict(gpus=4, batch_size=4, seq_len=1024, precision="amp-bf16", checkpointing=True)),
    ("qwen2.5-0.5b", dict(gpus=64, batch_size=2, seq_len=2048, precision="amp-bf16")),
    ("qwen2.5-0.5b", dict(gpus=8, batch_size=1, seq_len=256, precision="amp-bf16")),
]
GiB = 2**30
print("| model | setup | analytic GiB | simulated GiB | analytic / simulated - 1 | simulate s |")
print("|---|---|---|---|---|---|")
for name, kw in ROWS:
    setup = TrainSetup(shard="fsdp", **kw)
    a = estimate(name, setup, "analytic")
    t = time.time()
    s = estimate(name, setup, "simulate")
    dt = time.time() - t
    flags = " ".join(f"--{k.replace('_', '-')} {v}" if v is not True else f"--{k}" for k, v in kw.items())
    pa, ps = a.memory["peak_allocated"], s.memory["peak_allocated"]
    print(f"| {name} | {flags} | {pa / GiB:.3f} | {ps / GiB:.3f} | {pa / ps - 1:+.1%} | {dt:.0f} |", flush=True)
