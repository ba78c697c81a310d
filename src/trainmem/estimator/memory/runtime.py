"""What the CUDA runtime adds beyond the tensors a training step creates, calibrated on real runs.

Each constant names the measurement it comes from (docs/lab/data/validation-isolated-h200-2026-12-03.jsonl,
docs/lab/data/validation-h200-2026-12-02.jsonl and docs/lab/data/chapter-h200-2026-12-02.jsonl, H200, torch 2.11
+ CUDA 13).
"""

from __future__ import annotations

import functools

MiB = 1024**2

RESERVED_OVER_ALLOCATED = 1.096
"""Median of peak_reserved / peak_allocated over the 36 isolated validation runs (range 1.01-1.26;
docs/lab/data/validation-isolated-h200-2026-12-03.jsonl): the caching allocator's rounding and cached free
blocks. Only the analytic method uses it (autocast and sharded setups); simulate replays its allocations
through the allocator's policy (`allocator.py`)."""

DEEPSPEED_RESERVED_OVER_ALLOCATED = 1.25
"""The same ratio for a DeepSpeed ZeRO rank: the median over ten ranks measured on an H100 (1.12-1.42; ZeRO-1/2/3,
offload, worlds 2-8; docs/lab/zero-held-out-2026-12-06.md). DeepSpeed's flat buckets and partitions, allocated and
freed around the model's own tensors, leave more cached free blocks than a plain step. Fitted to those ranks: in
sample, not held out."""

LOGITS_BACKWARD_BYTES = 8.4
"""Transient bytes per logit element (tokens x vocabulary) at the start of backward: the fp32 gradient
of log-softmax and of its input; 8.26-8.57 measured across GPT-NeoX, Llama and Qwen2 (mean 8.4)."""


VALIDATED_ON = {"torch": "2.11", "transformers": "5.17"}
"""The releases the kernel model above (and simulate's stand-ins) was measured against (docs/accuracy.md); the
memory outside the allocator lives with each card (`gpus.GPU.overhead`). Other releases may change kernels,
model code and the allocator."""


def versions() -> dict[str, str]:
    """The installed torch and transformers, as the estimate ran them (read once a process: each read parses
    the packages' metadata, a few milliseconds, which the every-card table paid once per card)."""
    return dict(_installed())


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, str], ...]:
    from importlib.metadata import version

    return tuple((p, version(p)) for p in VALIDATED_ON)


def version_note(installed: dict[str, str]) -> str | None:
    """Says so when an installed release differs from the validated ones in major.minor."""
    off = [f"{p} {v}" for p, v in installed.items() if ".".join(v.split(".")[:2]) != VALIDATED_ON[p]]
    if not off:
        return None
    return (f"installed {', '.join(off)}: the kernel memory model was validated on torch {VALIDATED_ON['torch']} "
            f"+ transformers {VALIDATED_ON['transformers']} (H200, docs/accuracy.md); kernels, model "
            "code and the allocator of other releases may take different memory")
