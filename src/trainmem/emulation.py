"""`trainmem run --gpu CARD` on a bigger CUDA card: run the program that card would run.

A cap alone reproduces a smaller card's capacity, not its program: an H200 allocates 32 MiB cuBLAS
workspaces where older cards take 8 MiB + 128 KiB, and runs the flash SDPA kernel where a T4 or V100 has
only the memory-efficient one. So the run, inside its own worker process and before CUDA creates any
cuBLAS handle, takes the card's:
- allocator cap: the card's capacity less the setup's memory outside the allocator (`GPU.allocator_cap`,
  the cap the estimate replays under);
- cuBLAS workspace, through `CUBLAS_WORKSPACE_CONFIG` (":SIZE_KiB:COUNT" pairs, read by PyTorch's
  CublasHandlePool when it creates a handle's workspace);
- SDPA kernels, through `torch.nn.attention.sdpa_kernel` (no flash where the card has none).
Not emulated, and said in the result: kernel timings (throughput is the host card's), the host's own
context (outside the allocator, so not under the cap), and cuBLASLt's separate workspace.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from .gpus import CUBLAS_WORKSPACE_HOPPER, GPU

KiB = 1024


def workspace_config(card: GPU) -> str:
    """The `CUBLAS_WORKSPACE_CONFIG` whose sum is `card.cublas_workspace`: PyTorch's own defaults,
    ":4096:8" (32 MiB, sm90) and ":4096:2:16:8" (8 MiB + 128 KiB, every other architecture)."""
    return ":4096:8" if card.cublas_workspace == CUBLAS_WORKSPACE_HOPPER else ":4096:2:16:8"


def workspace_bytes(config: str) -> int:
    """Bytes a `CUBLAS_WORKSPACE_CONFIG` string asks for: the sum of SIZE_KiB x COUNT over its pairs."""
    parts = [int(x) for x in config.strip(":").split(":")]
    if len(parts) % 2:
        raise ValueError(f"CUBLAS_WORKSPACE_CONFIG {config!r}: expected :SIZE:COUNT pairs")
    return sum(size * KiB * count for size, count in zip(parts[::2], parts[1::2]))


def prepare(card: GPU, cap: int) -> dict[str, Any]:
    """Set the card's cuBLAS workspace for this process (before any CUDA matrix product) and say what
    the run emulates under the allocator cap `cap` (the setup's `cap_bytes`); the result records it
    under `env.emulated`."""
    config = workspace_config(card)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", config)
    return {"card": card.name, "allocator_cap": cap,
            "cublas_workspace_config": os.environ["CUBLAS_WORKSPACE_CONFIG"],
            "sdpa_kernels": "flash, memory-efficient, math" if card.flash else "memory-efficient, math (no flash)",
            "not_emulated": "kernel timings (throughput is the host card's); the host's context and lazily "
                            "loaded kernels, outside the allocator and its cap; cuBLASLt's own workspace"}


def kernels(card: GPU) -> contextlib.AbstractContextManager[Any]:
    """The SDPA backends `card` has, for the duration of the training loop."""
    if card.flash:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
