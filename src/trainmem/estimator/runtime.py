"""What the CUDA runtime adds beyond the tensors a training step creates, calibrated on real runs.

Each constant names the measurement it comes from (docs/data/validation-h200-2026-12-02.jsonl and
docs/data/chapter-h200-2026-12-02.jsonl, H200, torch 2.11 + CUDA 13).
"""

from __future__ import annotations

MiB = 1024**2

CUBLAS_WORKSPACE = 64 * MiB
"""Two cuBLAS handles (the forward thread's and autograd's) x 32 MiB on Hopper; measured as the gap between
`memory_allocated` after the first step and weights + gradients + states (0.0625 GiB in every full run)."""

CUBLAS_HANDLES = 2
"""The workspace is one 32 MiB caching-allocator block per handle, each in its own segment."""

RESERVED_OVER_ALLOCATED = 1.096
"""Median of peak_reserved / peak_allocated over the 36 validation runs (range 1.02-1.29): the caching
allocator's rounding and cached free blocks. Only the analytic method uses it; simulate replays its
allocations through the allocator's policy (`allocator.py`). `expandable_segments:True` would narrow it."""

DEVICE_OVERHEAD = 773 * MiB
"""Device memory beyond the allocator's reservations at the peak (device_used - peak_reserved): the CUDA
context (527 MiB at start) plus kernels loaded lazily (cuBLAS, bitsandbytes); median of the 36 validation
runs, range 767-777 MiB, on the H200. Cards in the catalog with their own `context` use that instead."""

LOGITS_BACKWARD_BYTES = 8.4
"""Transient bytes per logit element (tokens x vocabulary) at the start of backward: the fp32 gradient
of log-softmax and of its input; 8.26-8.57 measured across GPT-NeoX, Llama and Qwen2 (mean 8.4)."""
