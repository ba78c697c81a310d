"""What CUDA does for a training step that no tensor shows, decided in this one place: the SDPA kernel a call
gets, the cuBLAS workspaces, the memory the context and lazily loaded kernels take outside the allocator.

The estimate (`estimator`), the emulation of a card on a bigger one (`measure.emulation`) and the card
catalog (`hardware.gpus`) all ask here, so that a run under `--gpu T4` and an estimate for a T4 agree on
what a T4 does. Each figure names its source: PyTorch's code where it is a rule, an H200 measurement where
it is a size (torch 2.11 + CUDA 13, lazy module loading on; docs/cards.md).

    >>> import torch
    >>> sdpa_kernel(torch.bfloat16, grouped=False, mask=None, flash=has_flash((7, 5)))
    'efficient'
    >>> cublas_workspace((9, 0)) // 2**20, workspace_config((8, 6))
    (32, ':4096:2:16:8')

Known limits: the context is measured on the H200 only and derived for every other card (`derived_context`);
cuBLASLt's own workspace and NCCL's buffers are not modelled.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

MiB = 1024**2
KiB = 1024

# --- the SDPA kernel ------------------------------------------------------------------------------------
SDPA_SOURCE = ("pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: flash on [sm80, sm121] in "
               "fp16/bf16; memory-efficient on [sm50, sm121], bf16 from sm80")


def has_flash(sm: tuple[int, int]) -> bool:
    """PyTorch's flash-attention SDPA kernel runs on this compute capability (sm80 to sm121, `SDPA_SOURCE`):
    Blackwell's sm100 (B200), sm103 (B300) and sm120 (RTX 50xx, RTX PRO 6000) included, since sdp_utils.cpp
    compares major, then minor, as tuples compare here."""
    return (8, 0) <= sm <= (12, 1)


def sdpa_kernel(dtype: Any, grouped: bool, mask: Any, flash: bool, broadcast: bool = False) -> str:
    """CUDA's choice among its SDPA kernels: `flash` for half precision on a card with flash and no mask; the
    memory-efficient kernel (`efficient`) for fp32, for a boolean mask (sliding windows, padding: flash takes
    none) and, on cards without flash (sm70, sm75), every dtype. That kernel takes no grouped KV heads in
    fp32 or without flash, so those fall back to the `math` path. `dtype` is q's as the kernel gets it: under
    autocast the lower precision (autocast_mode.h lists SDPA). `broadcast`: k and v have fewer heads than q
    and the call does not say `enable_gqa`, so they are broadcast; only the math path broadcasts heads
    (sdp_utils.cpp's `check_batch_size_and_num_heads_dense` refuses the fused kernels), as Falcon-7b's multi-query
    attention calls it (an allocator trace of a Falcon-7b run on an H100, docs/lab)."""
    import torch

    if broadcast or grouped and (dtype == torch.float32 or not flash):
        return "math"
    return "flash" if flash and mask is None and dtype in (torch.float16, torch.bfloat16) else "efficient"


def sdpa_backends(flash: bool) -> contextlib.AbstractContextManager[Any]:
    """Restrict a real run to the SDPA backends of a card with (or without) flash, as `sdpa_kernel` assumes."""
    if flash:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend
    from torch.nn.attention import sdpa_kernel as backends

    return backends([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


# --- cuBLAS workspaces ------------------------------------------------------------------------------------
CUBLAS_SOURCE = ("pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp (commit 26a39059), "
                 "parseChosenWorkspaceSize: ':4096:2:16:8 default, 32MiB for Hopper' (major == 9 and minor == 0), "
                 "as torch 2.11 has it; from torch 2.12 (pytorch/pytorch#175344) majors 9, 10 and 12 get 32 MiB")
CUBLAS_HANDLES = 2
"""Handles that allocate a workspace in a training step: the forward thread's and autograd's backward
thread's, each one caching-allocator block in its own segment, held from its first matrix product on (the gap
between `memory_allocated` after the first step and weights + gradients + states was 0.0625 GiB = 2 x 32 MiB
in every full run on the H200, docs/lab)."""


def workspace_config(sm: tuple[int, int]) -> str:
    """PyTorch's default `CUBLAS_WORKSPACE_CONFIG` for a compute capability (`CUBLAS_SOURCE`): ":4096:8"
    (32 MiB) on sm90, ":4096:2:16:8" (8 MiB + 128 KiB) on every other architecture, Blackwell's sm100, sm103
    and sm120 included. That is torch 2.11's rule, the release the memory model was measured on
    (`runtime.VALIDATED_ON`); torch 2.12 and later give sm10x and sm12x 32 MiB too (pytorch/pytorch#175344, merged
    after 2.11's branch cut), two handles x about 24 MiB more than modelled here on a Blackwell card."""
    return ":4096:8" if sm == (9, 0) else ":4096:2:16:8"


def workspace_bytes(config: str) -> int:
    """Bytes a `CUBLAS_WORKSPACE_CONFIG` string asks for: the sum of SIZE_KiB x COUNT over its pairs."""
    parts = [int(x) for x in config.strip(":").split(":")]
    if len(parts) % 2:
        raise ValueError(f"CUBLAS_WORKSPACE_CONFIG {config!r}: expected :SIZE:COUNT pairs")
    return sum(size * KiB * count for size, count in zip(parts[::2], parts[1::2]))


def cublas_workspace(sm: tuple[int, int]) -> int:
    """Bytes of the workspace PyTorch allocates for each cuBLAS handle by default on this architecture."""
    return workspace_bytes(workspace_config(sm))


# --- memory outside the allocator ---------------------------------------------------------------------------
H200_CONTEXT_AT_START = 552_402_944
"""527 MiB: NVML device memory minus reserved right after the CUDA context is created (measured H200)."""
H200_OVERHEAD = 751 * MiB
"""Outside the allocator at the peak of a training step with no fused-attention kernel (context + lazily
loaded cuBLAS / bitsandbytes kernels; measured H200)."""
LAZY_KERNELS = H200_OVERHEAD - H200_CONTEXT_AT_START
"""224 MiB of kernel images loaded during the first step (measured on the H200; taken as is for every card,
because kernel images of one library are of similar size for each architecture: not measured elsewhere)."""
FUSED_ATTENTION_KERNELS = 16 * MiB
"""What loading the flash-attention kernels added on the H200 (767 vs 751 MiB). Applied to the
memory-efficient kernels of cards without flash: derived, not measured."""

STACK_PER_THREAD = 1024
"""CUDA's default per-thread stack (`cudaLimitStackSize`, 1 KiB on a fresh context). The driver reserves
local memory for it as max resident threads per SM x SMs x per-thread local memory, context-wide
(https://forums.developer.nvidia.com/t/local-memory-management/289339/9)."""

THREADS_PER_SM = {(7, 0): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536, (8, 9): 1536, (9, 0): 2048,
                  (10, 0): 2048, (10, 3): 2048, (12, 0): 1536}
"""Maximum resident threads per SM, CUDA C++ Programming Guide, "Features and Technical Specifications"."""


def local_memory(sm: tuple[int, int], sms: int) -> int:
    """Bytes of local memory the driver reserves at context creation for the default stack."""
    return sms * THREADS_PER_SM[sm] * STACK_PER_THREAD


CONTEXT_BASE = H200_CONTEXT_AT_START - local_memory((9, 0), 132)
"""263 MiB of the H200's context that does not scale with the card (driver state, kernels loaded at start)."""


def derived_context(sm: tuple[int, int], sms: int) -> int:
    """Bytes outside the allocator at the peak on a card of `sms` SMs: the H200's context less its local
    memory, this card's local memory, and the kernels loaded lazily on the H200. Equals the measured
    751 MiB for the H200 itself."""
    return CONTEXT_BASE + local_memory(sm, sms) + LAZY_KERNELS


def fused_attention_loaded(attention: str, precision: str, peft: str) -> bool:
    """Whether a step loads the fused-attention kernels (`FUSED_ATTENTION_KERNELS` outside the allocator):
    SDPA on half-precision q, k, v; not under QLoRA, whose activations are fp32, nor in fp32. flash-attn's kernels
    (`FLASH_ATTENTIONS`) are taken to load as much as PyTorch's flash kernel, FA2's own code (derived)."""
    return (attention == "sdpa" and precision != "fp32" and peft != "qlora") or attention in FLASH_ATTENTIONS


# --- flash-attn's kernels (transformers' flash_attention_2 / flash_attention_3) ------------------------------
FLASH_ATTN_VERSION = "2.8.3"
"""The flash-attn release whose sources the estimate's FlashAttention stand-in follows (`estimator.memory.standins`);
the package cannot be installed where trainmem was validated, so these figures are derived, not measured."""
FLASH_ATTN_SOURCE = (f"Dao-AILab/flash-attention v{FLASH_ATTN_VERSION}: flash_attn/flash_attn_interface.py "
                     "FlashAttnFunc, "
                     "csrc/flash_attn/flash_api.cpp mha_fwd/mha_bwd/set_params_splitkv (FA2); "
                     "hopper/flash_attn_interface.py FlashAttnFunc, hopper/flash_api.cpp mha_fwd/mha_bwd (FA3)")
FLASH_ATTENTIONS = {"flash_attention_2": 2, "flash_attention_3": 3}
"""transformers' `attn_implementation` names of flash-attn's kernels -> the FlashAttention version they call."""


def flash_attention_problem(attention: str, sm: tuple[int, int]) -> str | None:
    """Why flash-attn's kernels do not run on this compute capability, or None: FA2 needs Ampere or newer
    (flash_api.cpp `mha_fwd`: "FlashAttention only supports Ampere GPUs or newer", major >= 8); FA3 is built for
    Hopper, sm90 (hopper/setup.py compiles sm90a only, as flash-attn 2.8.3 ships it)."""
    version = FLASH_ATTENTIONS.get(attention)
    if version == 2 and sm < (8, 0):
        return "FlashAttention-2 needs compute capability 8.0 or newer (Ampere)"
    if version == 3 and sm[0] != 9:
        return "FlashAttention-3 runs on Hopper only (compute capability 9.x)"
    return None


def flash_splits(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, sms: int, dropout: float) -> int:
    """How many key/value splits FA2's forward takes (flash_api.cpp `set_params_splitkv` with
    `num_splits_heuristic`, `FLASH_ATTN_SOURCE`): with no dropout, and fewer (batch x heads x 64-row query
    blocks) than 0.8 x twice the SMs, the smallest split count whose wave efficiency is within 85% of the best;
    more than one allocates fp32 partial outputs for the forward's duration. `head_dim` is the padded one."""
    if dropout > 0:
        return 1
    block_n = 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64
    n_blocks = -(-seq_k // block_n)
    work, slots = batch * heads * -(-seq_q // 64), 2 * sms
    if work >= 0.8 * slots:
        return 1
    top = min(128, slots, n_blocks)

    def eligible(n: int) -> bool:
        return n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1))

    def efficiency(n: int) -> float:
        waves = work * n / slots
        return waves / math.ceil(waves)

    effs = {n: efficiency(n) for n in range(1, top + 1) if eligible(n)}
    best = max(effs.values(), default=0.0)
    return next((n for n, e in effs.items() if e >= 0.85 * best), 1)


# --- Liger's kernels ------------------------------------------------------------------------------------
LIGER_VERSION = "0.8.5"
"""The liger-kernel release whose sources the estimate's stand-ins follow (`estimator.memory.liger`)."""
LIGER_SOURCE = (f"linkedin/Liger-Kernel {LIGER_VERSION}: transformers/monkey_patch.py apply_liger_kernel_to_<family> "
                "defaults (rope, rms_norm, swiglu, fused_linear_cross_entropy on; cross_entropy off)")
_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")
LIGER_FAMILIES: dict[str, tuple[str, ...]] = {
    "llama": _LAYER_NORMS, "mistral": _LAYER_NORMS, "qwen2": _LAYER_NORMS,
    "qwen3": _LAYER_NORMS + ("self_attn.q_norm", "self_attn.k_norm"),
}
"""`model_type` -> the RMSNorm modules of each decoder layer that Liger's `apply_liger_kernel_to_<family>`
patches (`LIGER_SOURCE`); every family here also gets its final norm, its MLP's SwiGLU, its module's
`apply_rotary_pos_emb` and the fused linear cross-entropy forward. Liger's Triton kernels run on CUDA only."""


# --- Mamba's kernels --------------------------------------------------------------------------------------
MAMBA_SOURCE = ("state-spaces/mamba 2.3.2.post1 (mamba_ssm/ops/triton/ssd_combined.py, "
                "mamba_ssm/ops/selective_scan_interface.py, csrc/selective_scan/selective_scan.cpp) and "
                "Dao-AILab/causal-conv1d 1.6.1 (causal_conv1d_interface.py, cpp_functions.py)")
"""The sources whose autograd Functions the estimate's Mamba stand-ins follow (`estimator.memory.mamba`)."""
MAMBA_PATHS = ("torch", "kernels")
"""A Mamba mixer's two paths in transformers: its PyTorch chunked scan, or mamba-ssm's and causal-conv1d's
kernels, which transformers binds when its modeling module is imported where both are installed."""
MAMBA_FAMILIES: dict[str, str] = {
    "mamba": "inner", "falcon_mamba": "inner", "jamba": "scan", "zamba": "scan",
    "mamba2": "split", "bamba": "split", "falcon_h1": "split", "granitemoehybrid": "split", "zamba2": "split",
    "nemotron_h": "split",
}
"""`model_type` -> what its Mamba mixer calls in training with the kernels installed (transformers 5.17):
`split` mamba_split_conv1d_scan_combined (with the gated RMSNorm and out_proj inside), `inner` mamba_inner_fn,
`scan` causal_conv1d_fn then selective_scan_fn."""


__all__ = ["SDPA_SOURCE", "has_flash", "sdpa_kernel", "sdpa_backends", "CUBLAS_SOURCE", "CUBLAS_HANDLES",
           "workspace_config", "workspace_bytes", "cublas_workspace", "H200_CONTEXT_AT_START", "H200_OVERHEAD",
           "LAZY_KERNELS", "FUSED_ATTENTION_KERNELS", "STACK_PER_THREAD", "THREADS_PER_SM", "local_memory",
           "CONTEXT_BASE", "derived_context", "fused_attention_loaded", "LIGER_VERSION", "LIGER_SOURCE",
           "LIGER_FAMILIES", "FLASH_ATTN_VERSION", "FLASH_ATTN_SOURCE",
           "FLASH_ATTENTIONS", "flash_attention_problem", "flash_splits", "MAMBA_SOURCE", "MAMBA_PATHS",
           "MAMBA_FAMILIES"]
