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

from trainmem.hardware import cuda
from trainmem.hardware.gpus import GPU


def prepare(card: GPU, cap: int) -> dict[str, Any]:
    """Set the card's cuBLAS workspace for this process (before any CUDA matrix product) and say what
    the run emulates under the allocator cap `cap` (the setup's `cap_bytes`); the result records it
    under `env.emulated`."""
    config = cuda.workspace_config(card.sm)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", config)
    return {"card": card.name, "allocator_cap": cap,
            "cublas_workspace_config": os.environ["CUBLAS_WORKSPACE_CONFIG"],
            "sdpa_kernels": "flash, memory-efficient, math" if card.flash else "memory-efficient, math (no flash)",
            "not_emulated": "kernel timings (throughput is the host card's); the host's context and lazily "
                            "loaded kernels, outside the allocator and its cap; cuBLASLt's own workspace"}


def kernels(card: GPU) -> contextlib.AbstractContextManager[Any]:
    """The SDPA backends `card` has, for the duration of the training loop."""
    return cuda.sdpa_backends(card.flash)
