"""One rank of a large FSDP2 run, measured on one GPU (issue 40): ranks of models larger than the GPU, which the
fake-group rank can measure since it builds on the meta device and materialises only its own shards.

    python benchmarks/sharded_ranks_gpu.py OUT_DIR [INDEX ...]            # on the GPU: OUT_DIR/validation-sharded-ranks.jsonl
    python benchmarks/sharded_ranks_gpu.py compare OUT_DIR [--out FILE.md] # on a CPU: the estimates beside them

Each rank runs as `trainmem run --device cuda --gpus N --shard fsdp --rank R` in its own process
(`validate.isolated`, as `validate.py sharded` runs its set), 3 steps, up to 10 minutes each. `compare` computes the
analytic and simulated estimates of the same setups (`compare_sharded.py`: minutes per 70B row on a CPU) and prints
the error table, as docs/lab/data/errors-sharded.md. Held out: chosen before any of these ran, after the sharded
simulation was last changed.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from validate import isolated  # noqa: E402

NAME = "validation-sharded-ranks.jsonl"
CKPT = dict(checkpointing=True)
RANKS: list[tuple[str, dict]] = [
    # Llama-3.1-70B (141 GB in bf16): LoRA at world 64 and 8, full fine-tuning at world 24, the smallest world of 8s
    # that fits an H100 by the estimate (world 16 needs 82 GiB allocated at the optimizer step: fp32 master, gradient
    # and two Adam shards of 17.6 GB each, plus foreach AdamW's 17.6 GB temporary)
    ("llama70b", dict(precision="bf16", peft="lora", batch_size=1, seq_len=1024, gpus=64, **CKPT)),
    ("llama70b", dict(precision="amp-bf16", batch_size=1, seq_len=1024, gpus=24, **CKPT)),
    ("llama70b", dict(precision="bf16", peft="lora", batch_size=2, seq_len=2048, gpus=8, rank=3, **CKPT)),
    # Qwen3-30B-A3B (61 GB in bf16, 128 experts of 48 layers sharded with their layer)
    ("qwen3moe", dict(precision="bf16", batch_size=1, seq_len=1024, gpus=16, **CKPT)),
    ("qwen3moe", dict(precision="bf16", peft="lora", batch_size=2, seq_len=1024, gpus=8, **CKPT)),
    # Mixtral-8x7B (93 GB in bf16)
    ("mixtral", dict(precision="amp-bf16", batch_size=1, seq_len=1024, gpus=32, **CKPT)),
    ("mixtral", dict(precision="bf16", peft="lora", batch_size=2, seq_len=2048, gpus=8, **CKPT)),
    # dense models that fit whole, at worlds and ranks not measured before
    ("qwen7b", dict(precision="amp-bf16", batch_size=2, seq_len=1024, gpus=8)),
    ("mistral", dict(precision="bf16", peft="lora", batch_size=4, seq_len=1024, gpus=16, **CKPT)),
    ("mistral", dict(precision="amp-bf16", batch_size=2, seq_len=1024, gpus=8, rank=5, **CKPT)),
    ("gemma2", dict(precision="amp-bf16", batch_size=2, seq_len=2048, gpus=32)),
    ("llama8b", dict(precision="amp-bf16", batch_size=4, seq_len=2048, gpus=16, rank=7, **CKPT)),
]
"""Twelve ranks over Llama, Qwen (dense and MoE), Mistral/Mixtral and Gemma, LoRA and full, world 8 to 64."""


def main(argv: list[str]) -> int:
    if argv[0] == "compare":
        from compare_sharded import main as table

        out = argv[argv.index("--out") + 1] if "--out" in argv else None
        return table(os.path.join(argv[1], NAME), out)
    setups = [(arch, dict(kw, shard="fsdp", device="cuda")) for arch, kw in RANKS]
    return isolated(argv[0], [int(a) for a in argv[1:]], setups, NAME, steps=3, timeout=600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
